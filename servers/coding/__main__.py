"""``python -m servers.coding``: see `servers.coding.start_coding_server`."""

import sys

from servers.coding.start_coding_server import main

if __name__ == "__main__":
    sys.exit(main())
