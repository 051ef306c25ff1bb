"""The leaderboard (`eval/board/`): submit, verify, the board and its refusals."""
