"""The text files of a deployment directory, as pure functions of its `DeploymentSpec`.

Paths inside the directory are relative to it: Mosquitto and the host commands run with the directory as their
working directory (the systemd units set it, compose mounts it), so the directory can move as a whole. Only the
systemd units name the absolute `install_path`.
"""

from __future__ import annotations

from edgefleet.control.deployment.spec import DeploymentSpec

BROKER_DIR = "broker"  # owned by the broker user: plugin configuration, persistence, log
PKI_DIR = "pki"
KEYS_DIR = "keys"
DEVICES_DIR = "devices"
HEADER = "# Written by `edgefleet init` (edgefleet/control/deployment/templates.py).\n"


def mosquitto_conf(spec: DeploymentSpec) -> str:
    return (
        HEADER
        + f"""# Mosquitto 2.x for an edgefleet fleet: mutual TLS, the certificate CN as user name AND client id, and
# rights kept by the dynamic-security plugin, which the control plane changes as deployments change.
#
# Run it from this directory, whose paths it names relative to it:
#     cd {spec.where} && mosquitto -c mosquitto.conf
# (the broker unit in systemd/ and the compose file do the same). Started as root, Mosquitto switches to the user
# below before it opens anything else: that user reads {PKI_DIR}/server.key (group-readable) and owns {BROKER_DIR}/
# (`edgefleet init` run as root sets both). Started as another user it stays that user, who then needs the same.

# One set of security settings for every listener (plugin, anonymous access).
per_listener_settings false
user {spec.broker_user}

# No client without a certificate. Rights: the dynamic-security plugin (Debian's mosquitto package ships it).
# Default access is deny; each device has a role with its own topics, plus the group and bundle topics the
# control plane grants over $CONTROL/dynamic-security/v1 before it publishes a desired state naming them.
allow_anonymous false
plugin {spec.dynsec_plugin}
# Written once by `edgefleet init`; the broker owns and rewrites it from then on.
plugin_opt_config_file {BROKER_DIR}/dynamic-security.json

# Bundles travel as retained messages (an offer + content-addressed chunks) that a device may fetch days later:
# keep them across broker restarts.
persistence true
persistence_location {BROKER_DIR}/
autosave_interval 60

# Largest MQTT packet accepted: a 128 KiB chunk plus topic and headers, with headroom for an offer's chunk list
# (past 64 KiB it travels as index pages). Raise it together with the chunk size.
max_packet_size 262144

# A device downloading a bundle has a window of chunks in flight; an offline device's queue is bounded.
max_inflight_messages 64
max_queued_messages 1000
# Persistent sessions of clients gone this long are dropped (MQTT 3.1.1 sessions would otherwise live
# forever). A device back after that still finds its desired state and bundles: they are retained.
persistent_client_expiration 14d

# To a file here and to stderr (the journal, under systemd): a broker that cannot start says why.
log_dest file {BROKER_DIR}/mosquitto.log
log_dest stderr
log_type error
log_type warning
log_type notice
connection_messages true
log_timestamp_format %Y-%m-%dT%H:%M:%S

# --- The fleet listener: TLS with client certificates only. `edgefleet init --listen ADDRESS` binds it
# elsewhere than loopback (--listen all: every interface); the broker certificate names what clients dial
# (`--host`).
{spec.listener}
protocol mqtt
cafile {PKI_DIR}/ca.crt
certfile {PKI_DIR}/server.crt
keyfile {PKI_DIR}/server.key
tls_version tlsv1.2
require_certificate true
# The certificate's CN is the user name the plugin's roles apply to (a device id, or a control-plane identity),
# and the client id too: whatever id a client sends is replaced by its CN, so a device certificate cannot take
# over another client's session. Each control-plane process therefore needs its own certificate (two processes
# with one certificate would keep taking the id from each other): `edgefleet keys host --name edgefleet-host-b`.
use_identity_as_username true
use_username_as_clientid true
# Optional: refuse revoked device certificates at the TLS handshake (`edgefleet keys crl --ca-dir {PKI_DIR} --out
# {PKI_DIR}/crl.pem`, then `edgefleet keys revoke-device ID --crl {PKI_DIR}/crl.pem --ca-dir {PKI_DIR}`); Mosquitto
# re-reads it on SIGHUP (`systemctl reload edgefleet-broker`). Without it a revoked certificate still connects and
# has no rights at all. With it, the file must exist and be unexpired, or the broker refuses every certificate.
#crlfile {PKI_DIR}/crl.pem

# No plain listener: with allow_anonymous false and no password file Mosquitto 2 refuses every client on it.
"""
    )


def broker_unit(spec: DeploymentSpec) -> str:
    return (
        HEADER
        + f"""# Mosquitto for the fleet in {spec.where}, with the configuration there.
#   sudo install -m 0644 systemd/edgefleet-broker.service /etc/systemd/system/
#   sudo systemctl daemon-reload && sudo systemctl enable --now edgefleet-broker
# It starts as root and Mosquitto switches to the `user` of mosquitto.conf ({spec.broker_user}) itself, as Debian's
# own mosquitto.service does (stop that one, or give this one another port: both cannot bind {spec.port}).

[Unit]
Description=Mosquitto for the edgefleet fleet in {spec.where} (mutual TLS, dynamic security)
Documentation=man:mosquitto.conf(5)
After=network-online.target
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
WorkingDirectory={spec.where}
ExecStart={spec.mosquitto} -c mosquitto.conf
# SIGHUP: Mosquitto re-reads its configuration and the CRL; connections stay up.
ExecReload=/bin/kill -HUP $MAINPID
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""
    )


def control_unit(spec: DeploymentSpec) -> str:
    return (
        HEADER
        + f"""# The control plane (ingest, rollout engine, desired state, dashboard on {spec.dashboard}) for the
# fleet in {spec.where}: the host commands' context there (config.toml) gives it the broker, its own
# certificate ({spec.host_identities[0]}), the store and the keys.
#   sudo install -m 0644 systemd/edgefleet-control.service /etc/systemd/system/
#   sudo systemctl daemon-reload && sudo systemctl enable --now edgefleet-control
# A second instance (another machine, the same PostgreSQL store) needs its own certificate and --instance:
# docs/scale-out.md.

[Unit]
Description=edgefleet control plane for the fleet in {spec.where}
After=network-online.target edgefleet-broker.service
Wants=network-online.target edgefleet-broker.service

[Service]
Type=simple
WorkingDirectory={spec.where}
Environment=EDGEFLEET_CONFIG={spec.where}/config.toml
Environment=EDGEFLEET_CONTEXT={spec.context_name}
Environment=PYTHONUNBUFFERED=1
ExecStart={spec.edgefleet} control serve --instance main --http {spec.dashboard}
Restart=always
RestartSec=5
TimeoutStopSec=30

# It writes only the store, the ops key's counter and its cache, all in {spec.where}.
NoNewPrivileges=yes
ProtectSystem=strict
ReadWritePaths={spec.where}
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectControlGroups=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""
    )


def agent_unit(spec: DeploymentSpec) -> str:
    return (
        HEADER
        + f"""# The edgefleet device agent under systemd, on a device.
#
# Install (on the device, with the files `edgefleet init` wrote to {DEVICES_DIR}/ID/ for it):
#   sudo useradd --system --home-dir /var/lib/edgefleet --shell /usr/sbin/nologin edgefleet
#   sudo usermod -aG video,render edgefleet   # only the groups that exist: GPU/NPU nodes (Jetson, Intel)
#   sudo python3.11 -m venv /opt/edgefleet/venv && sudo /opt/edgefleet/venv/bin/pip install 'edgefleet[cpu]'
#   sudo install -d -m 0755 /etc/edgefleet /etc/edgefleet/trusted
#   sudo install -m 0644 ID/trusted/root.pub /etc/edgefleet/trusted/   # the pinned root key
#   sudo install -m 0644 ID/ca.crt ID/ID.crt /etc/edgefleet/
#   sudo install -m 0640 -g edgefleet ID/ID.key ID/agent.env /etc/edgefleet/
#   sudo install -m 0644 edgefleet-agent.service /etc/systemd/system/
#   sudo systemctl daemon-reload && sudo systemctl enable --now edgefleet-agent
#
# /etc/edgefleet/agent.env (written per device as {DEVICES_DIR}/ID/agent.env):
#   EDGEFLEET_BROKER={spec.device_url}
#   EDGEFLEET_DEVICE_ID=dev-1
#   EDGEFLEET_TLS_CA=/etc/edgefleet/ca.crt
#   EDGEFLEET_TLS_CERT=/etc/edgefleet/dev-1.crt
#   EDGEFLEET_TLS_KEY=/etc/edgefleet/dev-1.key
#   EDGEFLEET_AGENT_ARGS=--group lab
#
# Type=notify with WatchdogSec: the agent sends READY=1 once it is up and WATCHDOG=1 at least every 15 s
# (edgefleet.agent.daemon.watchdog).
#
# systemd runs edgefleet-launcher (standard library only, never replaced by an agent release), which runs the agent:
# the committed release's environment under /var/lib/edgefleet/agent-envs/, or this install until a release
# commits. It switches to a staged release under a health deadline and rolls back when the new agent fails it
# (docs/agent.md, "Agent updates"); it relays the agent's READY=1 and watchdog pings to systemd.

[Unit]
Description=edgefleet device agent (pull, verify, install and serve models)
Wants=network-online.target
After=network-online.target time-sync.target
# Restart=always, but a unit that crashes 10 times within 10 minutes stays failed (and visible as such)
# instead of looping forever; `systemctl reset-failed edgefleet-agent` lets it start again.
StartLimitIntervalSec=600
StartLimitBurst=10

[Service]
Type=notify
NotifyAccess=main
# Start-up loads the committed bundle and re-checks its golden set before READY=1; a TensorRT engine
# rebuilt on first start can take minutes (the agent may ask for more with EXTEND_TIMEOUT_USEC).
TimeoutStartSec=600
WatchdogSec=30
TimeoutStopSec=30
Restart=always
RestartSec=5

User=edgefleet
Group=edgefleet
Environment=EDGEFLEET_AGENT_ARGS=
Environment=PYTHONUNBUFFERED=1
Environment=PYTHONDONTWRITEBYTECODE=1
Environment=XDG_CACHE_HOME=/var/cache/edgefleet
# EDGEFLEET_BROKER, EDGEFLEET_DEVICE_ID and the EDGEFLEET_TLS_* files the agent reads from its environment.
EnvironmentFile=/etc/edgefleet/agent.env
ExecStart={spec.edgefleet}-launcher --state-dir /var/lib/edgefleet --deadline 300 -- \\
    --broker ${{EDGEFLEET_BROKER}} \\
    --device-id ${{EDGEFLEET_DEVICE_ID}} \\
    --profile auto \\
    --trust /etc/edgefleet/trusted \\
    $EDGEFLEET_AGENT_ARGS

# State (bundles, install state) in /var/lib/edgefleet; runtime caches (OpenVINO, TensorRT) in /var/cache.
StateDirectory=edgefleet
StateDirectoryMode=0750
CacheDirectory=edgefleet
CacheDirectoryMode=0750
ReadWritePaths=/var/lib/edgefleet
UMask=0027

# Memory: a ceiling for a model plus runtime; size it to the device's profile (memory budget).
MemoryHigh=1536M
MemoryMax=2G
TasksMax=256

# Hardening. Not set on purpose: PrivateDevices= (hides /dev/nvhost-*, /dev/dri, /dev/accel from the
# runtimes) and MemoryDenyWriteExecute= (oneDNN, OpenVINO and CUDA generate code at run time).
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
CapabilityBoundingSet=
AmbientCapabilities=

[Install]
WantedBy=multi-user.target
"""
    )


def agent_env(spec: DeploymentSpec, device_id: str) -> str:
    groups = " ".join(f"--group {g}" for g in spec.devices.get(device_id, ()))
    return (
        HEADER
        + f"""# /etc/edgefleet/agent.env on device {device_id} (see systemd/edgefleet-agent.service).
EDGEFLEET_BROKER={spec.device_url}
EDGEFLEET_DEVICE_ID={device_id}
EDGEFLEET_TLS_CA=/etc/edgefleet/ca.crt
EDGEFLEET_TLS_CERT=/etc/edgefleet/{device_id}.crt
EDGEFLEET_TLS_KEY=/etc/edgefleet/{device_id}.key
EDGEFLEET_AGENT_ARGS={groups}
"""
    )


def compose(spec: DeploymentSpec) -> str:
    agents = []
    for index, device_id in enumerate(sorted(spec.devices), start=1):
        groups = "".join(f", --group, {g}" for g in spec.devices[device_id])
        agents.append(
            f"""
  agent-{device_id}:
    <<: *edgefleet
    image: edgefleet:generic
    volumes:
      - ./{DEVICES_DIR}/{device_id}:/etc/edgefleet:ro
      - ./{DEVICES_DIR}/{device_id}/state:/var/lib/edgefleet
    command: [agent, --broker, "{spec.local_url}", --device-id, {device_id}{groups},
              --state-dir, /var/lib/edgefleet, --trust, /etc/edgefleet/trusted, --ca, /etc/edgefleet/ca.crt,
              --cert, /etc/edgefleet/{device_id}.crt, --key, /etc/edgefleet/{device_id}.key,
              --http-port, "{8470 + index}"]
"""
        )
    agent_services = "".join(agents)
    return (
        HEADER
        + f"""# The same fleet as the systemd units, in containers on this machine: the broker with this directory's
# mosquitto.conf, the control plane with its context (config.toml), and one agent per device with the files of
# {DEVICES_DIR}/ID/. Every service uses the host's network, so the listener, the broker URL and the dashboard
# address are those of mosquitto.conf and config.toml.
#
#   # images, from a checkout of edgefleet:
#   docker build -f deploy/docker/mosquitto.Dockerfile -t edgefleet-mosquitto .
#   docker build -f deploy/docker/Dockerfile.generic --build-arg EXTRAS="[host]" -t edgefleet:host .
#   docker build -f deploy/docker/Dockerfile.generic -t edgefleet:generic .
#   # then, in this directory (.env, written by `edgefleet init`, holds the user ids the files belong to):
#   docker compose up -d
#   docker compose run --rm host fleet status

name: edgefleet-{spec.context_name}

x-edgefleet: &edgefleet
  network_mode: host
  restart: unless-stopped
  user: "${{EDGEFLEET_UID:?run in the directory edgefleet init wrote (its .env)}}:${{EDGEFLEET_GID:?}}"

services:
  broker:
    <<: *edgefleet
    image: edgefleet-mosquitto
    user: "${{EDGEFLEET_BROKER_UID:?run in the directory edgefleet init wrote}}:${{EDGEFLEET_BROKER_GID:?}}"
    working_dir: /edgefleet
    volumes:
      - .:/edgefleet
    command: [mosquitto, -c, mosquitto.conf]

  control:
    <<: *edgefleet
    image: edgefleet:host
    depends_on: [broker]
    working_dir: /edgefleet
    environment:
      EDGEFLEET_CONFIG: /edgefleet/config.toml
      EDGEFLEET_CONTEXT: {spec.context_name}
    volumes:
      - .:/edgefleet
    command: [control, serve, --instance, main, --http, "{spec.dashboard}"]
{agent_services}
  # Host commands with the operator's context: `docker compose run --rm host COMMAND`.
  host:
    <<: *edgefleet
    image: edgefleet:host
    restart: "no"
    profiles: [tools]
    working_dir: /edgefleet
    environment:
      EDGEFLEET_CONFIG: /edgefleet/config.toml
      EDGEFLEET_CONTEXT: {spec.context_name}
    volumes:
      - .:/edgefleet
    command: [fleet, status]
"""
    )


def context_file(spec: DeploymentSpec) -> dict[str, object]:
    """The deployment's own context file (config.toml), paths relative to the directory."""
    host, operator = spec.host_identities
    return {
        "current-context": spec.context_name,
        "contexts": {
            spec.context_name: {
                "broker": spec.local_url,
                "prefix": spec.prefix,
                "ca": f"{PKI_DIR}/ca.crt",
                "cert": f"{PKI_DIR}/{operator}.crt",
                "key": f"{PKI_DIR}/{operator}.key",
                "control_cert": f"{PKI_DIR}/{host}.crt",
                "control_key": f"{PKI_DIR}/{host}.key",
                "store": "sqlite:control.sqlite",
                "home": ".",
            }
        },
    }
