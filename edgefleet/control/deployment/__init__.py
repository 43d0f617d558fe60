"""A whole secure deployment in one directory (`edgefleet init`): keys, a CA with the broker, host and device
certificates, the dynamic-security plugin's first configuration, a Mosquitto configuration that starts as written,
systemd units and a compose file. `templates` renders the text files (pure functions of a `DeploymentSpec`),
`directory` lays the directory out and gives the broker's files to the user Mosquitto runs as (`ownership`)."""

from edgefleet.control.deployment.directory import Created, create_deployment
from edgefleet.control.deployment.spec import DeploymentSpec, default_dynsec_plugin

__all__ = ["Created", "DeploymentSpec", "create_deployment", "default_dynsec_plugin"]
