"""Queries the tinyserve started by test.sh (its process id is the argument) on port 8089 and
writes /logs/verifier/reward.txt: the share of the six requirements met, or 0 when nothing
answers on 8089 at all (the server did not start, or listens elsewhere)."""

import http.client
import sys
import time
from collections.abc import Callable
from pathlib import Path

PORT = 8089
TOKEN = "tk-5f1e0c77a9d24b3b"
HOME = b"<!doctype html>\n<title>Acme</title>\n<h1>Welcome to Acme</h1>\n"
DOCS = b"<!doctype html>\n<title>Docs</title>\n<h1>Documentation</h1>\n"
GUIDE = b"<!doctype html>\n<title>Guide</title>\n<p>Start here.</p>\n"


def get(path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, http.client.HTTPMessage]:
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), response.headers
    finally:
        conn.close()


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_for_server(pid: int, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and running(pid):
        try:
            get("/")
            return True
        except OSError:
            time.sleep(0.1)
    return False


def requirement(name: str, check: Callable[[], bool]) -> bool:
    try:
        ok = check()
    except (OSError, http.client.HTTPException) as exc:
        print(f"{name}: {type(exc).__name__}: {exc}")
        return False
    print(f"{name}: {'ok' if ok else 'FAILED'}")
    return ok


def main() -> None:
    reward_file = Path("/logs/verifier/reward.txt")
    if not wait_for_server(int(sys.argv[1]), 8.0):
        print(f"nothing answers on port {PORT}")
        reward_file.write_text("0\n")
        return

    def site() -> bool:
        return (get("/")[:2] == (200, HOME) and get("/docs/")[:2] == (200, DOCS)
                and get("/docs/guide.html")[:2] == (200, GUIDE))

    def health() -> bool:
        return get("/status")[:2] == (200, b"ok")

    def no_store() -> bool:
        paths: list[tuple[str, dict[str, str]]] = [("/", {}), ("/status", {}), ("/missing.html", {}), ("/admin/stats", {})]
        return all(get(path, hdrs)[2].get("Cache-Control") == "no-store" for path, hdrs in paths)

    def dotfiles() -> bool:
        return all(get(path)[0] == 404 for path in ("/.env", "/docs/.draft.html", "/%2eenv"))

    def admin() -> bool:
        return (get("/admin/stats")[0] == 401
                and get("/admin/stats", {"Authorization": "Bearer wrong"})[0] == 401
                and get("/admin/stats", {"Authorization": f"Bearer {TOKEN}"})[0] == 200)

    def listens() -> bool:
        return get("/")[0] in (200, 404)  # an answer from tinyserve itself on 8089

    checks = {"listens": listens, "site": site, "health": health, "no_store": no_store,
              "dotfiles": dotfiles, "admin": admin}
    passed = sum(requirement(name, check) for name, check in checks.items())
    reward_file.write_text(f"{passed / len(checks):.4f}\n")


if __name__ == "__main__":
    main()
    sys.exit(0)
