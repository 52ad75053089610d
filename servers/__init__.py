"""Ready-made environment servers built on envsdk (``servers.sudoku``: TextArena Sudoku)."""
