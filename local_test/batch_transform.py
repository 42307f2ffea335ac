"""`python local_test/batch_transform.py INPUT OUTPUT ...`, the form docs/batch-transform.md
shows: the same runner as `python -m local_test.batch_transform`. The runner is the
package beside this file; an import of local_test.batch_transform gets the package
(Python prefers a package to a module of the same name), so this file is only ever
run as a script."""

import sys
from pathlib import Path

# As a script, sys.path[0] is local_test/ itself; the package imports from the root.
sys.path[0] = str(Path(__file__).resolve().parents[1])

from local_test.batch_transform.cli import main  # noqa: E402

sys.exit(main())
