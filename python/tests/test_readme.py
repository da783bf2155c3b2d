"""The README's Python examples that need nothing beyond the test extras run
as printed (against the test cluster) and print what the README says."""

import contextlib
import io
import re

from conftest import REPO

# Sections whose ```python block (the first after the heading) is run, and
# whose following ```text block is its exact output.
SECTIONS = ["### SQL and Arrow from Python"]


def example(section: str) -> tuple[str, str]:
    """The code and the printed output of `section` of README.md."""
    readme = (REPO / "README.md").read_text()
    at = readme.index(section)
    code = re.search(r"```python\n(.*?)```", readme[at:], re.S)
    assert code, f"no python block after {section!r}"
    out = re.search(r"```text\n(.*?)```", readme[at + code.end():], re.S)
    assert out, f"no text block after the python block of {section!r}"
    return code.group(1), out.group(1)


def test_the_sql_and_arrow_example_prints_what_the_readme_says(cluster, monkeypatch):
    for section in SECTIONS:
        code, expected = example(section)
        assert '"127.0.0.1:7070"' in code
        # The README's default address is the test cluster's here; the token
        # comes from the environment, as the README's connect reads it.
        code = code.replace('"127.0.0.1:7070"', repr(cluster.addr))
        monkeypatch.setenv("INSITU_AUTH_TOKEN", cluster.token)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"README.md {section}", "exec"), {})
        assert printed.getvalue() == expected
