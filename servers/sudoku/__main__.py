"""``python -m servers.sudoku``: see `servers.sudoku.start_sudoku_server`."""

import sys

from servers.sudoku.start_sudoku_server import main

if __name__ == "__main__":
    sys.exit(main())
