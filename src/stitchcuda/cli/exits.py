"""Exit codes, part of the interface: 0 success (for ``verify``: the candidate passed), 1 a negative
result (``verify``: it did not pass; ``doctor``: a check failed), 2 unusable arguments, tasks or
store, 3 an internal error (a bug of ours, its traceback kept in a file), 130 interrupted (Ctrl-C)."""

EXIT_PASSED, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
