#!/bin/bash
# Oracle: write the INI file the six requirements ask for, then let the server check it.
set -euo pipefail
cat > /etc/tinyserve/tinyserve.ini <<'INI'
[server]
port = 8089
bind = 127.0.0.1

[site]
root = /srv/site/public
index = home.html
hide_dotfiles = yes

[health]
path = /status

[headers]
Cache-Control = no-store

[admin]
token_file = /etc/tinyserve/admin.token
INI
python3 /opt/tinyserve/tinyserve.py --config /etc/tinyserve/tinyserve.ini --check
