"""``python -m servers.textarena``: see `servers.textarena.start_textarena_server`."""

import sys

from servers.textarena.start_textarena_server import main

if __name__ == "__main__":
    sys.exit(main())
