"""Package discovery for the two source roots, `platform/nshot` and `methods/` (README: Layout).

`platform/` holds the library `nshot`; `methods/` is installed as `nshot.methods`. Every
package under both roots is found here so that a new method folder needs no edit.
"""

from setuptools import find_packages, setup

packages = find_packages("platform", include=["nshot", "nshot.*"])
packages += ["nshot.methods"] + [f"nshot.methods.{p}" for p in find_packages("methods")]

setup(packages=packages)
