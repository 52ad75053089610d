#!/bin/bash
# Verifier of deploy-account: reads the account databases through getent and the tree through
# stat, and checks every numbered requirement of the instruction; reward 1 only if all hold.
set -u
reward=0
trap 'echo "$reward" > /logs/verifier/reward.txt' EXIT

failures=0
expect() {  # expect WHAT GOT WANTED
    if [ "$2" != "$3" ]; then
        echo "$1: got '$2', wanted '$3'"
        failures=$((failures + 1))
    fi
}
field() {  # field DB KEY N: field N of the getent entry
    getent "$1" "$2" | cut -d: -f"$3"
}
has_member() {  # has_member GROUP USER -> yes/no
    if field group "$1" 4 | tr ',' '\n' | grep -qx "$2"; then echo yes; else echo no; fi
}
owner_mode() {
    stat -c '%U:%G %a' "$1" 2>/dev/null
}

expect "group web id" "$(field group web 3)" 2100
expect "group deploy id" "$(field group deploy 3)" 2001
expect "deploy uid" "$(field passwd deploy 3)" 2001
expect "deploy primary gid" "$(field passwd deploy 4)" 2001
expect "deploy home" "$(field passwd deploy 6)" /home/deploy
expect "deploy shell" "$(field passwd deploy 7)" /bin/bash
expect "deploy in web" "$(has_member web deploy)" yes
expect "www-data in web" "$(has_member web www-data)" yes
expect "www-data uid" "$(field passwd www-data 3)" 33
expect "www-data home" "$(field passwd www-data 6)" /var/www
expect "www-data shell" "$(field passwd www-data 7)" /usr/sbin/nologin
expect "/home/deploy" "$(owner_mode /home/deploy)" "deploy:deploy 700"

for d in /srv/site /srv/site/releases /srv/site/releases/2024-01-10 /srv/site/shared; do
    [ -d "$d" ] || expect "folder $d" missing present
done
while IFS= read -r -d '' d; do
    expect "$d" "$(owner_mode "$d")" "deploy:web 2775"
done < <(find -P /srv/site -type d -print0 2>/dev/null)
while IFS= read -r -d '' f; do
    expect "$f" "$(owner_mode "$f")" "deploy:web 664"
done < <(find -P /srv/site/releases -type f -print0 2>/dev/null)
expect "releases/2024-01-10/index.html" "$(cat /srv/site/releases/2024-01-10/index.html 2>/dev/null)" "<h1>site</h1>"
expect "current link" "$(readlink /srv/site/current)" /srv/site/releases/2024-01-10

secrets=/srv/site/shared/secrets.env
expect "$secrets" "$(owner_mode "$secrets")" "deploy:deploy 600"
[ -L "$secrets" ] && expect "$secrets is a link" yes no
expect "$secrets contents" "$(sha256sum < "$secrets" 2>/dev/null | cut -d' ' -f1)" \
    e537259088dffeadabeb54e380d12bf4967b2bbd78b5161e1730b005aa2c7b2b

if [ "$failures" == 0 ]; then
    reward=1
fi
