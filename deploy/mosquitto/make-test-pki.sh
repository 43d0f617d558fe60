#!/usr/bin/env bash
# Create test credentials for a broker and N devices with `edgefleet keys`, plus the dynamic-security config.
#
#   deploy/mosquitto/make-test-pki.sh [OUT_DIR] [N_DEVICES] [BROKER_HOST...]
#
#   OUT_DIR       default ./pki (must not hold credentials already: nothing is ever overwritten)
#   N_DEVICES     default 3: devices dev-1 .. dev-N (prefix from $DEVICE_PREFIX), all in group $GROUP (lab)
#   BROKER_HOST   names/IPs clients dial, default: localhost mosquitto (127.0.0.1 is always included)
#
# Writes ca.crt/ca.key, server.crt/server.key, a host certificate per control-plane identity ($HOSTS, default
# "edgefleet-host edgefleet-cli": one per process that connects at the same time, the client id is the CN),
# DEVICE.crt/.key for each device, and dynamic-security.json: the plugin's first configuration (base rights for
# each device, the edgefleet-host role for the host identities; bundle rights follow deployments from then on).
# $EDGEFLEET overrides the command, e.g. EDGEFLEET="python -m edgefleet".
set -euo pipefail

read -r -a edgefleet <<< "${EDGEFLEET:-edgefleet}"
out=${1:-./pki}
count=${2:-3}
if (($# >= 2)); then shift 2; else shift "$#"; fi
hosts=("$@")
if ((${#hosts[@]} == 0)); then hosts=(localhost mosquitto); fi
prefix=${DEVICE_PREFIX:-dev-}
group=${GROUP:-lab}

if ! [[ $count =~ ^[0-9]+$ ]]; then
    echo "N_DEVICES must be a number, not '$count'" >&2
    exit 2
fi

"${edgefleet[@]}" keys ca --dir "$out"
"${edgefleet[@]}" keys server --dir "$out" --host "${hosts[@]}"
read -r -a host_names <<< "${HOSTS:-edgefleet-host edgefleet-cli}"
acl_args=()
for name in "${host_names[@]}"; do
    "${edgefleet[@]}" keys host --dir "$out" --name "$name"
    acl_args+=(--host-user "$name")
done

for ((i = 1; i <= count; i++)); do
    device="${prefix}${i}"
    "${edgefleet[@]}" keys device "$device" --dir "$out"
    acl_args+=(--device "${device}:${group}")
done
"${edgefleet[@]}" keys dynsec "${acl_args[@]}" --out "$out/dynamic-security.json"

echo
echo "Broker: ca.crt, server.crt, server.key, dynamic-security.json (see deploy/mosquitto/README.md)."
echo "Each device gets ca.crt and its own DEVICE.crt/DEVICE.key; each control-plane process its own host certificate."
