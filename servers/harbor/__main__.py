"""``python -m servers.harbor``: see `servers.harbor.start_harbor_server`."""

import sys

from servers.harbor.start_harbor_server import main

if __name__ == "__main__":
    sys.exit(main())
