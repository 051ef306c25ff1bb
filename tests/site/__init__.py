"""The results site (`eval/site/`), shown in a real headless browser."""
