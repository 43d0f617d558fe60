#!/usr/bin/env bash
# Create test credentials for a broker and N devices with `edgefleet keys`, plus the ACL.
#
#   deploy/mosquitto/make-test-pki.sh [OUT_DIR] [N_DEVICES] [BROKER_HOST...]
#
#   OUT_DIR       default ./pki (must not hold credentials already: nothing is ever overwritten)
#   N_DEVICES     default 3: devices dev-1 .. dev-N (prefix from $DEVICE_PREFIX), all in group $GROUP (lab)
#   BROKER_HOST   names/IPs clients dial, default: localhost mosquitto (127.0.0.1 is always included)
#
# Writes ca.crt/ca.key, server.crt/server.key, edgefleet-host.crt/.key, DEVICE.crt/.key for each device,
# and edgefleet.acl (no bundle assigned yet: regenerate it with --assign DEVICE=BUNDLE when you deploy).
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
"${edgefleet[@]}" keys host --dir "$out"

acl_args=()
for ((i = 1; i <= count; i++)); do
    device="${prefix}${i}"
    "${edgefleet[@]}" keys device "$device" --dir "$out"
    acl_args+=(--device "${device}:${group}")
done
if ((count > 0)); then
    "${edgefleet[@]}" keys acl "${acl_args[@]}" --out "$out/edgefleet.acl"
fi

echo
echo "Broker: ca.crt, server.crt, server.key, edgefleet.acl (see deploy/mosquitto/README.md)."
echo "Each device gets ca.crt and its own DEVICE.crt/DEVICE.key; the control plane edgefleet-host.crt/.key."
