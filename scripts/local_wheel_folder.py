"""The folder holding the wheel that `pip install --dry-run --report -` chose, read from
that report on stdin, so that uv installs the same wheel from the same place; exit 1
when pip chose none or a remote one (the Makefile then lets pip install it)."""

import json
import os
import sys
import urllib.parse
import urllib.request


def main() -> int:
    try:
        (chosen,) = json.load(sys.stdin)["install"]
        url = urllib.parse.urlparse(chosen["download_info"]["url"])
    except (ValueError, KeyError, TypeError):
        return 1
    if url.scheme != "file":
        return 1
    print(os.path.dirname(urllib.request.url2pathname(url.path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
