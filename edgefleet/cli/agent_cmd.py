"""`edgefleet agent`: the on-device daemon."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path

from pydantic import ValidationError

from edgefleet.agent import quality
from edgefleet.agent.api import GenerationConfig, ServiceConfig
from edgefleet.agent.daemon import AgentConfig
from edgefleet.agent.runtime import Policy
from edgefleet.agent.schedule import BatchingConfig
from edgefleet.cli.common import add_tls, resolve
from edgefleet.core.errors import UserInputError
from edgefleet.core.launcher_files import ENV_LAUNCHER, ENV_TRIAL
from edgefleet.core.topics import DEFAULT_PREFIX


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("agent", help="run the device agent (pull, verify, install, serve, report)")
    env = os.environ.get
    parser.add_argument(
        "--broker", default=env("EDGEFLEET_BROKER"), required=not env("EDGEFLEET_BROKER"),
        help="mqtt://HOST:PORT or mqtts://HOST:PORT (env EDGEFLEET_BROKER)",
    )  # fmt: skip
    parser.add_argument(
        "--device-id", default=env("EDGEFLEET_DEVICE_ID"), required=not env("EDGEFLEET_DEVICE_ID"),
        help="this device's id, its certificate's CN on a TLS broker (env EDGEFLEET_DEVICE_ID)",
    )  # fmt: skip
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--profile", default="auto", help="profile name, or auto to detect")
    parser.add_argument("--group", action="append", default=[], help="groups this device belongs to")
    parser.add_argument(
        "--trust",
        type=Path,
        action="append",
        default=[],
        help="pinned root public key (root.pub) or a directory of them (default STATE_DIR/trusted)",
    )
    parser.add_argument("--keyset", type=Path, default=None, help="a root-signed keyset.json to start from (optional)")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX)
    parser.add_argument("--protocol", choices=["auto", "3.1.1", "5"], default="auto")
    parser.add_argument("--telemetry-interval", type=float, default=5.0, help="seconds between telemetry reports")
    parser.add_argument("--threads", type=int, default=0, help="inference threads (0: the bundle's or measured)")
    parser.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        help="memory the device's models may use together (default: the profile's budget)",
    )
    parser.add_argument(
        "--max-bytes-per-s", type=int, default=None, help="byte-rate cap of this device's link (paid links)"
    )
    add_tls(parser, context=False)
    parser.add_argument("--health-interval", type=float, default=30.0, help="seconds between health checks")
    parser.add_argument("--no-rollback", action="store_true", help="report an unhealthy bundle but keep it")
    parser.add_argument("--spool-max", type=int, default=10_000, help="telemetry/events kept until stored")
    parser.add_argument(
        "--report-resend-after",
        type=float,
        default=30.0,
        metavar="S",
        help="send again a report the control plane has not stored after S seconds (default 30)",
    )
    parser.add_argument("--report-resend-rate", type=float, default=50.0, metavar="N",
                        help="reports sent again per second, at most (default 50)")  # fmt: skip
    quality.add_arguments(parser)
    parser.add_argument(
        "--benchmark-max-cpu-share", type=float, default=0.5,
        help="the most of this device's cores a host's benchmark request may use while serving goes on "
        "(0 refuses them)",
    )  # fmt: skip
    api = parser.add_argument_group("local inference API (HTTP on loopback or a Unix socket)")
    api.add_argument("--http-port", type=int, default=8470, help="loopback TCP port (0: pick a free one)")
    api.add_argument("--http-socket", type=Path, default=None, help="serve on this Unix socket instead of TCP")
    api.add_argument("--no-http", action="store_true", help="no local API (remote calls over MQTT only)")
    api.add_argument("--http-queue", type=int, default=64, help="requests waiting beyond this get 503")
    api.add_argument("--http-max-body-mb", type=float, default=8.0, help="larger requests get 413")
    api.add_argument("--http-host", default="127.0.0.1",
                     help="listen address (default 127.0.0.1); beyond loopback only with an API token")  # fmt: skip
    api.add_argument(
        "--http-allowed-host", action="append", default=[], metavar="NAME",
        help="a Host name (NAME or NAME:PORT) the API answers besides the listen address and localhost (repeatable); "
        "any other Host is refused (DNS rebinding)",
    )  # fmt: skip
    api.add_argument(
        "--api-token-file", type=Path, default=None, metavar="FILE",
        help="every request must carry Authorization: Bearer <the file's first line> (also $EDGEFLEET_API_TOKEN)",
    )  # fmt: skip
    api.add_argument(
        "--api-token", default=None, metavar="TOKEN",
        help="the token itself (visible in ps: prefer --api-token-file or $EDGEFLEET_API_TOKEN)",
    )  # fmt: skip
    batch = parser.add_argument_group("dynamic batching (local API; models with a symbolic batch dimension)")
    batch.add_argument(
        "--batch-max-queue-delay-ms", type=float, default=None, metavar="MS",
        help="join concurrent requests into one run, waiting at most MS for others to join (0: join only what is "
        "already queued); off unless given. A model whose batch is fixed is served unbatched, and says why",
    )  # fmt: skip
    batch.add_argument("--batch-preferred-size", type=int, default=8, metavar="N",
                       help="rows a batch is formed up to (default 8)")  # fmt: skip
    batch.add_argument("--batch-instances", type=int, default=1, metavar="N",
                       help="batches of one model running at once (default 1)")  # fmt: skip
    gen = parser.add_argument_group("generative models (local API and MQTT)")
    gen.add_argument("--generation-concurrency", type=int, default=2, help="generations running at once")
    gen.add_argument("--generation-queue", type=int, default=2, help="generations waiting; beyond them 503")
    gen.add_argument("--max-tokens", type=int, default=1024, help="the most tokens one request may generate")
    gen.add_argument(
        "--drain", type=float, default=30.0, metavar="S",
        help="a swap lets the old model's generations finish for S seconds, then cuts them (default 30)",
    )  # fmt: skip
    choice = parser.add_argument_group("execution provider choice")
    choice.add_argument(
        "--prefer-provider",
        action="append",
        default=[],
        metavar="P",
        help="use P whenever it passes the golden set, even when slower (repeatable, in order)",
    )
    choice.add_argument("--exclude-provider", action="append", default=[], metavar="P", help="never use P")
    choice.add_argument(
        "--engine-build-timeout",
        type=float,
        default=1800.0,
        help="seconds allowed for a load that builds a TensorRT engine",
    )
    ops = parser.add_argument_group("custom operators")
    ops.add_argument(
        "--custom-ops",
        action="append",
        default=[],
        metavar="PACKAGE",
        help="custom-op package (.py file or module) this device runs (also $EDGEFLEET_CUSTOM_OPS)",
    )
    ops.add_argument(
        "--custom-op-libs",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="directory of compiled custom-op libraries (also $EDGEFLEET_CUSTOM_OP_LIBS)",
    )
    choice.add_argument("--load-timeout", type=float, default=60.0, help="seconds before a loading provider is skipped")
    parser.set_defaults(func=cmd_agent)


def cmd_agent(args: argparse.Namespace) -> None:
    from edgefleet.agent.runtime import ort_distribution

    if args.verbose == 0:
        logging.getLogger().setLevel(logging.INFO)  # a daemon's log is its record of what it refused
    runtime = ort_distribution.require()  # before anything imports onnxruntime: a clear refusal, not a traceback
    logging.getLogger("edgefleet.agent").info("ONNX Runtime: %s", runtime)

    from edgefleet.agent.daemon import Agent
    from edgefleet.agent.runtime import custom_ops

    resolve(args)  # the TLS files from their variables (a device reads no context file)
    try:
        config = _config(args)
    except ValidationError as err:
        first = err.errors()[0]
        raise UserInputError(f"invalid agent option {'.'.join(map(str, first['loc']))}: {first['msg']}") from err
    custom_ops.configure(args.custom_ops, args.custom_op_libs)
    agent = Agent(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run()


def _config(args: argparse.Namespace) -> AgentConfig:
    launcher = os.environ.get(ENV_LAUNCHER)
    return AgentConfig(
        launcher=Path(launcher) if launcher else None,
        trial_token=os.environ.get(ENV_TRIAL) or None,
        broker=args.broker,
        device_id=args.device_id,
        state_dir=args.state_dir,
        profile=args.profile,
        groups=args.group,
        trust=args.trust,
        keyset=args.keyset,
        prefix=args.prefix,
        protocol=args.protocol,
        telemetry_interval_s=args.telemetry_interval,
        threads=args.threads,
        memory_budget_mb=args.memory_budget_mb,
        max_bytes_per_s=args.max_bytes_per_s,
        health_interval_s=args.health_interval,
        rollback_on_failure=not args.no_rollback,
        spool_max_records=args.spool_max,
        report_resend_after_s=args.report_resend_after,
        report_resend_per_s=args.report_resend_rate,
        quality=quality.config_from(args),
        benchmark_max_cpu_share=args.benchmark_max_cpu_share,
        tls_ca=args.tls_ca,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        selection=Policy(
            prefer=args.prefer_provider,
            exclude=args.exclude_provider,
            load_timeout_s=args.load_timeout,
            engine_build_timeout_s=args.engine_build_timeout,
        ),
        generation=GenerationConfig(
            concurrency=args.generation_concurrency,
            queue=args.generation_queue,
            max_tokens=args.max_tokens,
            drain_s=args.drain,
        ),
        http=None
        if args.no_http
        else ServiceConfig(
            port=args.http_port,
            unix_socket=args.http_socket,
            queue_size=args.http_queue,
            max_body_bytes=int(args.http_max_body_mb * 2**20),
            host=args.http_host,
            allowed_hosts=tuple(args.http_allowed_host),
            api_token=_api_token(args),
            batching=None
            if args.batch_max_queue_delay_ms is None
            else BatchingConfig(
                max_queue_delay_ms=args.batch_max_queue_delay_ms,
                preferred_batch_size=args.batch_preferred_size,
                instances=args.batch_instances,
            ),
        ),
    )


def _api_token(args: argparse.Namespace) -> str | None:
    """The local API's token: --api-token-file's first line, --api-token, or $EDGEFLEET_API_TOKEN (None: no token)."""
    if args.api_token_file is not None:
        try:
            token = args.api_token_file.read_text("utf-8").strip().splitlines()[0].strip()
        except (OSError, UnicodeDecodeError, IndexError) as err:
            raise SystemExit(f"--api-token-file {args.api_token_file}: cannot read a token ({err})") from err
    else:
        token = args.api_token or os.environ.get("EDGEFLEET_API_TOKEN") or ""
    if token and len(token) < 16:
        raise SystemExit("the API token must be at least 16 characters")
    return token or None
