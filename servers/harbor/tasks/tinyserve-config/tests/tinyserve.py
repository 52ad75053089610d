"""tinyserve: a small static web server configured by one INI file.

    python3 tinyserve.py --config /etc/tinyserve/tinyserve.ini [--check]

Sections and keys (anything else is refused, so a misspelt key is an error, not a silent default):

    [server]   port (required), bind (default 127.0.0.1)
    [site]     root (required): the folder served at /
               index (default index.html): the file answered for a folder
               hide_dotfiles (yes/no, default no): 404 for any path with a part starting with "."
    [health]   path: answers 200 with the body "ok" (text/plain)
    [headers]  name = value: headers added to every response
    [admin]    token_file: /admin/stats then needs "Authorization: Bearer <token>", where the
               token is the file's contents without surrounding whitespace; without [admin] the
               /admin/ paths answer 404

--check only reads and checks the configuration, printing "config ok" or the error.
"""

from __future__ import annotations

import argparse
import configparser
import json
import mimetypes
import posixpath
import sys
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ALLOWED = {
    "server": {"port", "bind"},
    "site": {"root", "index", "hide_dotfiles"},
    "health": {"path"},
    "admin": {"token_file"},
}


class ConfigError(Exception):
    """The configuration file is missing or wrong; the message says where."""


class _Parser(configparser.ConfigParser):
    """INI reading that keeps the case of keys (header names)."""

    def optionxform(self, optionstr: str) -> str:
        return optionstr


class Config:
    def __init__(self, path: Path) -> None:
        parser = _Parser(interpolation=None, inline_comment_prefixes=(";", "#"))
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        try:
            parser.read(path, encoding="utf-8")
        except configparser.Error as exc:
            raise ConfigError(f"{path}: {exc}".replace("\n", " ")) from None
        for section in parser.sections():
            if section == "headers":
                continue
            if section not in ALLOWED:
                raise ConfigError(f"{path}: unknown section [{section}]")
            for key in parser[section]:
                if key not in ALLOWED[section]:
                    raise ConfigError(f"{path}: [{section}] unknown key {key!r}")
        for section in ("server", "site"):
            if section not in parser:
                raise ConfigError(f"{path}: missing section [{section}]")
        try:
            self.port = parser.getint("server", "port")
            self.hide_dotfiles = parser.getboolean("site", "hide_dotfiles", fallback=False)
        except (configparser.Error, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        self.bind = parser.get("server", "bind", fallback="127.0.0.1")
        self.root = Path(parser.get("site", "root", fallback=""))
        if not self.root.is_dir():
            raise ConfigError(f"{path}: [site] root {str(self.root)!r} is not a folder")
        self.index = parser.get("site", "index", fallback="index.html")
        self.health = parser.get("health", "path", fallback=None)
        self.headers = dict(parser["headers"]) if "headers" in parser else {}
        self.token: str | None = None
        if "admin" in parser:
            token_file = Path(parser.get("admin", "token_file", fallback=""))
            try:
                self.token = token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"{path}: [admin] token_file: {exc}") from None
            if not self.token:
                raise ConfigError(f"{path}: [admin] token_file {str(token_file)!r} is empty")


def make_handler(config: Config) -> type[BaseHTTPRequestHandler]:
    counter = {"requests": 0}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "tinyserve/1.0"

        def end_headers(self) -> None:
            for name, value in config.headers.items():
                self.send_header(name, value)
            super().end_headers()

        def reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            with lock:
                counter["requests"] += 1
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            if config.health is not None and path == config.health:
                self.reply(HTTPStatus.OK, b"ok")
            elif path == "/admin" or path.startswith("/admin/"):
                self.admin(path)
            else:
                self.static(path)

        def admin(self, path: str) -> None:
            if config.token is None:
                self.reply(HTTPStatus.NOT_FOUND, b"not found")
            elif self.headers.get("Authorization", "") != f"Bearer {config.token}":
                self.reply(HTTPStatus.UNAUTHORIZED, b"unauthorized")
            elif path == "/admin/stats":
                with lock:
                    body = json.dumps(counter).encode()
                self.reply(HTTPStatus.OK, body, "application/json")
            else:
                self.reply(HTTPStatus.NOT_FOUND, b"not found")

        def static(self, path: str) -> None:
            parts = [part for part in posixpath.normpath(path).split("/") if part not in ("", ".")]
            if ".." in parts or (config.hide_dotfiles and any(p.startswith(".") for p in parts)):
                self.reply(HTTPStatus.NOT_FOUND, b"not found")
                return
            target = config.root.joinpath(*parts)
            if target.is_dir():
                target = target / config.index
            if not target.is_file():
                self.reply(HTTPStatus.NOT_FOUND, b"not found")
                return
            kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
            self.reply(HTTPStatus.OK, target.read_bytes(), kind)

        def log_message(self, format: str, *args: object) -> None:
            sys.stderr.write("tinyserve: " + format % args + "\n")

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser(description="a small static web server")
    parser.add_argument("--config", default="/etc/tinyserve/tinyserve.ini")
    parser.add_argument("--check", action="store_true", help="check the configuration and exit")
    args = parser.parse_args()
    try:
        config = Config(Path(args.config))
    except ConfigError as exc:
        print(f"tinyserve: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print("config ok")
        return 0
    server = ThreadingHTTPServer((config.bind, config.port), make_handler(config))
    print(f"tinyserve: serving {config.root} on {config.bind}:{config.port}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
