"""Measure the web pages: weight (HTML + JS + CSS, uncompressed) and the session page's
ready time (docs/web.md, Quality).

Starts a server on a throw-away SQLite database (local single-user mode), creates a
500-item session, loads every page in Debian's chromium (Playwright) and prints each
page's bytes by kind, then the session page's ``omnigent-session-ready`` mark over
``--loads`` loads (the first one also warms the server). Run from the repository:
``.venv/bin/python scripts/page_weights.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from omnigent_runner.bundles import build_bundle  # noqa: E402
from testing.processes import base_env, migrate, start_server  # noqa: E402

AGENT = "name: big\ndescription: Measures.\nprompt: Answer.\nexecutor:\n  model: mock-model\n"
PAGES = {
    "sessions": "/",
    "new session": "/new",
    "inbox": "/inbox",
    "runners": "/runners",
    "webhooks": "/webhooks",
    "schedules": "/schedules",
    "usage": "/usage",
    "sign-in": "/signin",
}
WEIGHTS_JS = """() => {
  const sizes = {html: 0, js: 0, css: 0, modules: 0};
  const nav = performance.getEntriesByType('navigation')[0];
  sizes.html = nav.decodedBodySize;
  for (const r of performance.getEntriesByType('resource')) {
    if (r.name.endsWith('.js')) { sizes.js += r.decodedBodySize; sizes.modules += 1; }
    else if (r.name.endsWith('.css')) sizes.css += r.decodedBodySize;
  }
  return sizes;
}"""


def kib(size: int) -> str:
    return f"{size / 1024:.1f}"


def weigh(page: object, url: str) -> dict[str, int]:
    page.goto(url, wait_until="load")  # type: ignore[attr-defined]
    return dict(page.evaluate(WEIGHTS_JS))  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--loads", type=int, default=6)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed")
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        env = base_env(
            DATABASE_URL=f"sqlite:///{tmp}/db.sqlite3",
            OMNIGENT_DATA_DIR=f"{tmp}/data",
            OMNIGENT_LOCAL_SINGLE_USER="true",
        )
        migrate(env, Path(tmp))
        server = start_server(env=env, log_dir=Path(tmp), stack=stack)
        with server.client(None) as client:
            bundle = build_bundle({"agent.yaml": AGENT})
            agent = client.post(
                "/v1/agents", files={"bundle": ("a.tar.gz", bundle, "application/gzip")}
            ).json()["id"]
            items = []
            for index in range(250):
                items.append({"type": "message", "role": "user", "content": f"question {index}"})
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": f"Answer **{index}** with `code` and a list:\n\n- one\n- two\n",
                    }
                )
            created = client.post(
                "/v1/sessions", json={"agent_id": agent, "title": "Long", "initial_items": items}
            )
            created.raise_for_status()
            session_id = created.json()["id"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            pages = {"session (500 items)": f"/s/{session_id}", **PAGES}
            for name, path in pages.items():
                sizes = weigh(page, server.url + path)
                total = sizes["html"] + sizes["js"] + sizes["css"]
                print(
                    f"{name}: {kib(sizes['html'])} + {kib(sizes['js'])} ({sizes['modules']} "
                    f"modules) + {kib(sizes['css'])} = {kib(total)} KiB"
                )
            timings = []
            for _ in range(args.loads):
                page.goto(f"{server.url}/s/{session_id}")
                page.wait_for_selector("body[data-ready='1']")
                timings.append(
                    page.evaluate(
                        "performance.getEntriesByName('omnigent-session-ready')[0].startTime"
                    )
                )
            warm = timings[1:] or timings
            print(
                f"session ready (ms): first {timings[0]:.0f}, then median "
                f"{statistics.median(warm):.0f} (min {min(warm):.0f}, max {max(warm):.0f})"
            )
            browser.close()


if __name__ == "__main__":
    main()
