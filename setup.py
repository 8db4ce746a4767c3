"""The package map pyproject.toml cannot express: the top-level templates/, static/ and migrations/
folders (DESIGN.md's layout) go into the wheel as package data inside `app`, where app/resources.py
finds them. Everything else about the project is in pyproject.toml."""

import os

from setuptools import find_packages, setup

RESOURCES = {"app.templates": "templates", "app.static": "static", "app.migrations": "migrations"}


def resource_packages() -> tuple[dict[str, str], dict[str, list[str]]]:
    """Each resource folder, and each folder below it with a name Python can import, as a package of
    data (setuptools warns about, and may one day drop, data folders that are not listed); folders named
    otherwise (``swagger-ui-5.35.0``) are data of the nearest such package."""
    packages: dict[str, str] = {}
    data: dict[str, list[str]] = {}
    for package, folder in RESOURCES.items():
        for here, dirs, _files in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            rel = os.path.relpath(here, folder)
            parts = [] if rel == "." else rel.split(os.sep)
            k = 0
            while k < len(parts) and parts[k].isidentifier():
                k += 1
            name = ".".join([package, *parts[:k]])
            packages[name] = os.path.join(folder, *parts[:k])
            data.setdefault(name, []).append("/".join([*parts[k:], "*"]))
    return packages, data


PACKAGES, DATA = resource_packages()
# the evaluation suites' prompt files, records and licences (draftdeck/drafter/eval/suites)
DATA["draftdeck.drafter.eval.suites"] = ["*.jsonl.gz", "sources.json", "*.LICENSE.txt"]
# the config.json of popular targets `draftdeck plan --target NAME` reads (draftdeck/drafter/train/targets)
DATA["draftdeck.drafter.train.targets"] = ["*.json"]

setup(
    packages=[*find_packages(include=["draftdeck*", "app*", "workers*"]), *PACKAGES],
    package_dir=PACKAGES,
    package_data=DATA,
    exclude_package_data={"": ["*.pyc"]},
)
