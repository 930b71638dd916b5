"""Maps the `frota` namespace package, spread over two source roots, to setuptools.

`operator/` holds the control plane and `worker_image/` the data plane; both
contribute subpackages to the one `frota` namespace (see DESIGN.md). setuptools'
automatic discovery assumes one root per package, so the mapping is explicit.
"""

from pathlib import Path

from setuptools import setup

ROOTS = ("operator", "worker_image")


def discover() -> dict[str, str]:
    package_dir: dict[str, str] = {}
    for root in ROOTS:
        for init in sorted(Path(root, "frota").rglob("__init__.py")):
            package = ".".join(init.parent.relative_to(root).parts)
            package_dir[package] = init.parent.as_posix()
    return package_dir


PACKAGE_DIR = discover()
setup(packages=sorted(PACKAGE_DIR), package_dir=PACKAGE_DIR,
      package_data={"": ["*.yaml", "*.json", "*.lua", "*.jinja", "*.cpp"]})
