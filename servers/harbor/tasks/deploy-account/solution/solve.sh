#!/bin/bash
# Oracle: groupadd/useradd with the fixed ids, usermod -aG for www-data, then chown/chmod with find
# (-P: never through the current link).
set -euo pipefail
groupadd --gid 2100 web
groupadd --gid 2001 deploy
useradd --uid 2001 --gid deploy --groups web --home-dir /home/deploy --create-home --shell /bin/bash deploy
chmod 700 /home/deploy
usermod -a -G web www-data
find -P /srv/site -type d -exec chown deploy:web {} + -exec chmod 2775 {} +
find -P /srv/site/releases -type f -exec chown deploy:web {} + -exec chmod 664 {} +
chown deploy:deploy /srv/site/shared/secrets.env
chmod 600 /srv/site/shared/secrets.env
