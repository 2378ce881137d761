"""The docs site looked at as a reader would (issue 38): built strictly, served on 127.0.0.1,
pages opened in headless Chromium (Debian's chromium, driven by Playwright), then checked:
the navigation lists every section and leads to the quickstart, code blocks are highlighted
and have a copy button, the search box finds the quickstart and troubleshooting, and the
generated references are there. Screenshots go to the folder given.

Usage: python tests/integration/docs/check_site.py OUT_DIR   (needs chromium, playwright)
"""

import http.server
import pathlib
import subprocess
import sys
import tempfile
import threading

REPO = pathlib.Path(__file__).resolve().parents[3]
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]


def main(out: str) -> int:
  from playwright.sync_api import sync_playwright
  out_dir = pathlib.Path(out)
  out_dir.mkdir(parents=True, exist_ok=True)
  site = pathlib.Path(tempfile.mkdtemp()) / "site"
  subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                 cwd=REPO, check=True, capture_output=True)
  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
      pass

  handler = lambda *a: Quiet(*a, directory=str(site))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  base = f"http://127.0.0.1:{server.server_address[1]}"
  checks = []
  try:
    with sync_playwright() as p:
      browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_FLAGS)
      page = browser.new_page(viewport={"width": 1280, "height": 900})
      page.goto(base + "/")
      nav = page.locator("nav.md-nav--primary").inner_text()
      checks.append(("navigation lists every section", all(
          s in nav for s in ("Tutorials", "How-to guides", "Explanations", "Troubleshooting",
                             "Reference"))))
      page.get_by_role("link", name="Five-minute quickstart").first.click()
      page.wait_for_load_state()
      checks.append(("navigation leads to the quickstart",
                     page.title().startswith("Five-minute quickstart")))
      page.screenshot(path=str(out_dir / "quickstart.png"), full_page=False)
      checks.append(("code blocks are highlighted (Pygments' spans)",
                     page.locator("div.highlight pre code span").count() > 100))
      checks.append(("code blocks have a copy button",
                     page.locator("[title='Copy to clipboard']").count() >= 3))
      page.locator("label.md-search__icon, .md-search__input").first.click()
      page.keyboard.type("hang")
      page.wait_for_selector(".md-search-result__item", timeout=10_000)
      results = page.locator(".md-search-result__item").all_inner_texts()
      checks.append(("search finds troubleshooting for 'hang'",
                     any("Troubleshooting" in r or "hang" in r.lower() for r in results)))
      page.screenshot(path=str(out_dir / "search.png"))
      page.goto(base + "/reference/config/")
      checks.append(("the config reference lists training.zero_stage",
                     "training.zero_stage" in page.inner_text("article")))
      page.screenshot(path=str(out_dir / "config-reference.png"))
      page.goto(base + "/reference/api/")
      checks.append(("the API reference renders tfdist.fit's arguments",
                     "train_data" in page.inner_text("article")))
      browser.close()
  finally:
    server.shutdown()
  for name, ok in checks:
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
  return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1]))
