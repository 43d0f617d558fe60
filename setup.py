"""The package layout (everything else is in pyproject.toml).

Three top-level folders install under the `edgefleet` package: agent/ as edgefleet.agent, converter/ as
edgefleet.converter, device_profiles/ (YAML data) as
edgefleet.device_profiles. setuptools' `package_dir` maps them, in
the wheel and in an editable install alike; `packages` lists every subpackage under its installed name.
"""

from setuptools import find_packages, setup

MAPPED = {
    "edgefleet.agent": "agent",
    "edgefleet.converter": "converter",
    "edgefleet.device_profiles": "device_profiles",
}

packages = find_packages(include=["edgefleet", "edgefleet.*"])
for name, folder in MAPPED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir={"edgefleet": "edgefleet", **MAPPED},
)
