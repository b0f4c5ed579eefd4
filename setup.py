"""The package list of the build; everything else is in pyproject.toml.

Besides webapp/ and rlhf/ the wheel carries the top-level templates/ and static/ as the packages
webapp.templates and webapp.static (pyproject.toml maps their folders), so an installed app finds
its pages inside the webapp package. pyproject.toml's [tool.setuptools.packages.find] finds only
folders below their parent package, hence this list.
"""
from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["webapp*", "rlhf*"]) + ["webapp.templates", "webapp.static"])
