"""One version and one set of shared metadata for every package under packages/.

    python tools/release.py check          # exit 1 and list every file that disagrees (CI: nox -s lint)
    python tools/release.py write          # make every package agree (run after adding or merging a package)
    python tools/release.py bump 0.2.0     # set VERSION, then write

The version lives in ``VERSION`` at the repository root. ``write`` stamps into each ``packages/*/pyproject.toml``:

- ``version``, and every requirement that names a sibling package pinned to exactly that version
  (``kernel-switchboard-cudnn[vendor]==0.2.0``; extras and markers are kept);
- the shared metadata below (authors, SPDX license, license file, Python window, URLs, the shared
  classifiers; a package may add classifiers of its own) and the setuptools that understands it;
- ``__version__ = "..."`` in the package's ``src/*/__init__.py`` where such a line exists;
- a copy of the root ``LICENSE`` beside the pyproject, so every wheel and sdist carries it.

A new package needs only its own name, description, readme, dependencies and entry points: ``write`` adds
the rest. Edits are textual and keep each file's layout and comments; ``check`` re-reads every file with a
TOML parser and compares values, so what it accepts is what the build backend will see.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
VERSION_FILE = ROOT / "VERSION"
LICENSE_FILE = ROOT / "LICENSE"
#: the public repository; every package's URLs derive from it
REPOSITORY = "https://github.com/kernel-switchboard/kernel-switchboard"

#: [project] keys every package carries, with their values (TOML types as Python values)
SHARED_PROJECT: dict[str, Any] = {
    "requires-python": ">=3.10",
    "license": "Apache-2.0",
    "license-files": ["LICENSE"],
    "authors": [{"name": "Kernel Switchboard developers"}],
}
SHARED_URLS: dict[str, str] = {
    "Homepage": REPOSITORY,
    "Documentation": f"{REPOSITORY}#readme",
    "Source": REPOSITORY,
    "Issues": f"{REPOSITORY}/issues",
    "Changelog": f"{REPOSITORY}/blob/main/CHANGELOG.md",
}
#: classifiers every package has (a package may list more of its own)
SHARED_CLASSIFIERS = [
    "Development Status :: 3 - Alpha",
    "Intended Audience :: Developers",
    "Intended Audience :: Science/Research",
    "Programming Language :: Python :: 3",
    "Programming Language :: Python :: 3 :: Only",
    "Programming Language :: Python :: 3.10",
    "Programming Language :: Python :: 3.11",
    "Programming Language :: Python :: 3.12",
    "Programming Language :: Python :: 3.13",
    "Topic :: Scientific/Engineering :: Artificial Intelligence",
    "Typing :: Typed",
]
#: the first setuptools that reads SPDX ``license`` expressions and ``license-files`` (PEP 639)
BUILD_REQUIRES = ["setuptools>=77"]

_REQUIREMENT = re.compile(
    r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?P<extras>\[[^\]]*\])?\s*(?P<spec>[^;]*?)\s*(?P<marker>;.*)?$")
_VERSION_LINE = re.compile(r'^__version__\s*=\s*["\'][^"\']*["\']', re.M)


def normalize(name: str) -> str:
    """PEP 503 name: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pyprojects() -> list[Path]:
    return sorted(ROOT.glob("packages/*/pyproject.toml"))


def read_version() -> str:
    version = VERSION_FILE.read_text().strip()
    if not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.post\d+)?(?:\.dev\d+)?", version):
        raise SystemExit(f"release: VERSION holds {version!r}, not a PEP 440 release like 1.2.3 or 1.2.3rc1")
    return version


def siblings() -> set[str]:
    """Normalised distribution names of every package under packages/."""
    return {normalize(tomllib.loads(p.read_text())["project"]["name"]) for p in pyprojects()}


def pin(requirement: str, names: set[str], version: str) -> str:
    """``requirement`` with an exact ``==version`` when it names a sibling; unchanged otherwise."""
    m = _REQUIREMENT.match(requirement)
    if m is None or normalize(m["name"]) not in names:
        return requirement
    return f"{m['name']}{m['extras'] or ''}=={version}{m['marker'] or ''}"


# -- TOML text editing ----------------------------------------------------------------------------------------

def render(value: Any) -> str:
    """A TOML value: strings, lists and inline tables of them; lists longer than a line go one item a line."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {render(v)}" for k, v in value.items()) + " }"
    items = [render(v) for v in value]
    line = "[" + ", ".join(items) + "]"
    if len(line) <= 100:
        return line
    return "[\n" + "".join(f"  {item},\n" for item in items) + "]"


def _sections(lines: list[str]) -> Iterator[tuple[str, int, int]]:
    """(table name, first body line, end line) for each ``[table]`` header (end excluded)."""
    headers = [(i, line.strip()[1:-1].strip()) for i, line in enumerate(lines)
               if line.startswith("[") and not line.startswith("[[") and line.strip().endswith("]")]
    for n, (i, name) in enumerate(headers):
        end = headers[n + 1][0] if n + 1 < len(headers) else len(lines)
        yield name, i + 1, end


def _section(lines: list[str], table: str) -> tuple[int, int] | None:
    for name, start, end in _sections(lines):
        if name == table:
            return start, end
    return None


def _value_end(lines: list[str], i: int) -> int:
    """The line after the value that starts on line ``i`` (arrays and inline tables may span lines)."""
    depth, quote = 0, ""
    for j in range(i, len(lines)):
        text = lines[j] if j > i else lines[j].split("=", 1)[1]
        k = 0
        while k < len(text):
            ch = text[k]
            if quote:
                if ch == "\\" and quote == '"':
                    k += 1
                elif ch == quote:
                    quote = ""
            elif ch in "\"'":
                quote = ch
            elif ch == "#":
                break
            elif ch in "[{":
                depth += 1
            elif ch in "]}":
                depth -= 1
            k += 1
        if depth <= 0:
            return j + 1
    raise ValueError(f"unterminated value from line {i + 1}")


def _key_line(lines: list[str], start: int, end: int, key: str) -> int | None:
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    return next((i for i in range(start, end) if pattern.match(lines[i])), None)


def set_key(text: str, table: str, key: str, value: Any, after: str | None = None) -> str:
    """``text`` with ``key = value`` in ``[table]``: replaced where present, else added after ``after`` (or at
    the end of the table). The table must exist."""
    lines = text.splitlines()
    span = _section(lines, table)
    if span is None:
        raise ValueError(f"no [{table}] table")
    start, end = span
    new = f"{key} = {render(value)}".splitlines()
    i = _key_line(lines, start, end, key)
    if i is not None:
        lines[i:_value_end(lines, i)] = new
    else:
        j = _key_line(lines, start, end, after) if after else None
        if j is not None:
            at = _value_end(lines, j)
        else:
            at = end
            while at > start and not lines[at - 1].strip():
                at -= 1
        lines[at:at] = new
    return "\n".join(lines) + "\n"


def set_table(text: str, table: str, values: dict[str, str], after: str) -> str:
    """``text`` with ``[table]`` holding exactly ``values``: replaced where present, else added after ``[after]``."""
    lines = text.splitlines()
    body = [f"{k} = {render(v)}" for k, v in values.items()]
    span = _section(lines, table)
    if span is not None:
        start, end = span
        while end > start and not lines[end - 1].strip():
            end -= 1
        lines[start:end] = body
    else:
        anchor = _section(lines, after)
        if anchor is None:
            raise ValueError(f"no [{after}] table")
        at = anchor[1]
        while at > anchor[0] and not lines[at - 1].strip():
            at -= 1
        lines[at:at] = ["", f"[{table}]", *body]
    return "\n".join(lines) + "\n"


def pin_siblings(text: str, names: set[str], version: str) -> str:
    """Every quoted requirement in ``[project] dependencies`` and ``[project.optional-dependencies]`` that names a
    sibling, pinned to ``==version``."""
    lines = text.splitlines()
    regions = []
    project = _section(lines, "project")
    if project is not None:
        i = _key_line(lines, *project, "dependencies")
        if i is not None:
            regions.append((i, _value_end(lines, i)))
    extras = _section(lines, "project.optional-dependencies")
    if extras is not None:
        regions.append(extras)
    quoted = re.compile(r'"([^"\\]*)"')
    for start, end in regions:
        for i in range(start, end):
            head, sep, comment = lines[i].partition("#")
            head = quoted.sub(lambda m: json.dumps(pin(m[1], names, version)), head)
            lines[i] = head + sep + comment
    return "\n".join(lines) + "\n"


# -- the two verbs ----------------------------------------------------------------------------------------------

def expected_project(version: str) -> dict[str, Any]:
    return {"version": version, **SHARED_PROJECT, "urls": SHARED_URLS}


def write_pyproject(path: Path, version: str, names: set[str]) -> None:
    text = path.read_text()
    if _section(text.splitlines(), "build-system") is None:
        text = '[build-system]\nrequires = []\nbuild-backend = "setuptools.build_meta"\n\n' + text
    text = set_key(text, "build-system", "requires", BUILD_REQUIRES)
    text = set_key(text, "project", "version", version, after="name")
    anchor = "version"
    for key, value in SHARED_PROJECT.items():
        text = set_key(text, "project", key, value, after=anchor)
        anchor = key
    own = [c for c in tomllib.loads(text)["project"].get("classifiers", []) if c not in SHARED_CLASSIFIERS]
    text = set_key(text, "project", "classifiers", SHARED_CLASSIFIERS + own, after=anchor)
    text = pin_siblings(text, names, version)
    text = set_table(text, "project.urls", SHARED_URLS, after="project")
    path.write_text(text)


def version_files(package: Path) -> list[Path]:
    """The ``src/*/__init__.py`` files of a package that hold a ``__version__ = "..."`` line."""
    return [p for p in sorted(package.glob("src/*/__init__.py")) if _VERSION_LINE.search(p.read_text())]


def write() -> list[str]:
    version, names, license_text = read_version(), siblings(), LICENSE_FILE.read_text()
    for path in pyprojects():
        write_pyproject(path, version, names)
        for init in version_files(path.parent):
            init.write_text(_VERSION_LINE.sub(f'__version__ = "{version}"', init.read_text(), count=1))
        (path.parent / "LICENSE").write_text(license_text)
    return check()


def _requirements(project: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for req in project.get("dependencies", []):
        yield "dependencies", req
    for extra, reqs in project.get("optional-dependencies", {}).items():
        for req in reqs:
            yield f"optional-dependencies.{extra}", req


def check() -> list[str]:
    """Every disagreement with VERSION and the shared metadata, one line each (empty: all agree)."""
    version, names, license_text = read_version(), siblings(), LICENSE_FILE.read_text()
    problems: list[str] = []
    for path in pyprojects():
        rel = path.relative_to(ROOT)
        data = tomllib.loads(path.read_text())
        project = data["project"]
        for key, want in expected_project(version).items():
            if project.get(key) != want:
                problems.append(f"{rel}: [project] {key} = {project.get(key)!r}, expected {want!r}")
        missing = [c for c in SHARED_CLASSIFIERS if c not in project.get("classifiers", [])]
        if missing:
            problems.append(f"{rel}: [project] classifiers lack {missing}")
        if any(c.startswith("License ::") for c in project.get("classifiers", [])):
            problems.append(f"{rel}: a License :: classifier beside the SPDX license expression (setuptools refuses both)")
        requires = data.get("build-system", {}).get("requires", [])
        if requires != BUILD_REQUIRES:
            problems.append(f"{rel}: [build-system] requires = {requires!r}, expected {BUILD_REQUIRES!r}")
        for where, req in _requirements(project):
            if pin(req, names, version) != req:
                problems.append(f"{rel}: {where} {req!r} is not pinned to =={version}")
        readme = project.get("readme")
        if not isinstance(readme, str) or not (path.parent / readme).is_file():
            problems.append(f"{rel}: [project] readme {readme!r} is not a file beside it")
        lic = path.parent / "LICENSE"
        if not lic.is_file() or lic.read_text() != license_text:
            problems.append(f"{lic.relative_to(ROOT)}: missing or not a copy of the root LICENSE")
        for init in version_files(path.parent):
            found = _VERSION_LINE.search(init.read_text())
            if found is None or found[0].split("=", 1)[1].strip().strip("\"'") != version:
                problems.append(f"{init.relative_to(ROOT)}: {found[0] if found else '__version__'} != {version!r}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser("check", help="exit 1 when any package disagrees with VERSION or the shared metadata")
    sub.add_parser("write", help="make every package agree with VERSION and the shared metadata")
    bump = sub.add_parser("bump", help="set VERSION, then write")
    bump.add_argument("version")
    args = parser.parse_args(argv)
    if args.verb == "bump":
        VERSION_FILE.write_text(args.version.strip() + "\n")
        read_version()
    problems = check() if args.verb == "check" else write()
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print(f"release: {len(problems)} disagreement(s); `python tools/release.py write` fixes them", file=sys.stderr)
        return 1
    print(f"release: {len(pyprojects())} packages agree on version {read_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
