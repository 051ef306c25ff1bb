"""The grader and what reads its rows (`eval/grading`, `eval/stats`, `eval/reports`,
`eval/experiments`): rows, run folders, manifests, statistics, reports, the experiments, the
private split, the trust properties of grading and the Ray backend."""
