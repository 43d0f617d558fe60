"""`edgefleet context list|show|use|set|delete`: the named contexts of the host commands (see cli/context.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edgefleet.cli import context as context_file
from edgefleet.cli.common import SETTINGS, add_json, lookup, print_json, print_table
from edgefleet.core.errors import UnknownNameError, UserInputError

# `context set` options: the context key, its flag, what it is.
_KEYS = (
    ("broker", "--broker", "broker URL, mqtt://HOST:PORT or mqtts://HOST:PORT"),
    ("prefix", "--prefix", "MQTT topic prefix"),
    ("protocol", "--protocol", "MQTT protocol: auto, 3.1.1 or 5"),
    ("ca", "--ca", "the broker's CA certificate"),
    ("cert", "--cert", "the operator's client certificate"),
    ("key", "--key", "its private key"),
    ("control_cert", "--control-cert", "`control serve`'s own client certificate"),
    ("control_key", "--control-key", "its private key"),
    ("store", "--store", "control-plane store URL"),
    ("home", "--home", "EDGEFLEET_HOME for this context: the keys (keys/), caches, the default store"),
    ("password_file", "--password-file", "a file holding the PostgreSQL store's password (keeps it out of the URL)"),
)


def _shown(key: str, value: str | None) -> str | None:
    """A value as printed: a store URL with its password redacted."""
    if key == "store" and value:
        from edgefleet.control.store.url import redacted

        return redacted(value)
    return value


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "context",
        help="named connection settings for the host commands (broker, TLS files, store, prefix), like kubectl's",
        description=f"Contexts live in ${context_file.CONFIG_ENV}, else $EDGEFLEET_HOME/config.toml. A flag beats "
        f"its variable, which beats the context (`edgefleet --context NAME` or ${context_file.CONTEXT_ENV}, else "
        "the file's current-context), which beats the default.",
    )  # fmt: skip
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    listing = verbs.add_parser("list", help="every context; * marks the current one")
    add_json(listing)
    listing.set_defaults(func=cmd_list)
    show = verbs.add_parser("show", help="the settings a host command would use now, and where each comes from")
    show.add_argument("name", nargs="?", help="a context (default: the one in force)")
    add_json(show)
    show.set_defaults(func=cmd_show)
    use = verbs.add_parser("use", help="make a context the current one")
    use.add_argument("name")
    use.set_defaults(func=cmd_use)
    put = verbs.add_parser("set", help="create a context or change some of its keys (paths are stored absolute)")
    put.add_argument("name")
    for key, flag, what in _KEYS:
        put.add_argument(flag, dest=key, default=None, help=what)
    put.add_argument("--unset", action="append", default=[], metavar="KEY", help="remove a key (repeatable)")
    put.add_argument("--use", action="store_true", help="also make it the current context")
    put.set_defaults(func=cmd_set)
    delete = verbs.add_parser("delete", help="remove a context")
    delete.add_argument("name")
    delete.set_defaults(func=cmd_delete)


def cmd_list(args: argparse.Namespace) -> None:
    path = context_file.config_path()
    config = context_file.load(path)
    if args.json:
        print_json(
            {
                "file": path,
                "current": config.current_context,
                "contexts": {
                    n: {k: _shown(k, v) for k, v in c.model_dump(exclude_none=True).items()}
                    for n, c in config.contexts.items()
                },
            }
        )
        return
    if not config.contexts:
        print(f"no contexts in {path}; `edgefleet init DIR` writes one, `edgefleet context set NAME` adds one")
        return
    print_table(
        f"contexts in {path}",
        ["", "name", "broker", "store", "home"],
        [
            ("*" if name == config.current_context else "", name, c.broker, _shown("store", c.store), c.home)
            for name, c in sorted(config.contexts.items())
        ],
    )


def cmd_show(args: argparse.Namespace) -> None:
    selected = context_file.select(args.name or args.context)
    rows = []
    for s in SETTINGS.values():
        value, source = lookup(s, selected)
        rows.append((s.flag, s.env, _shown(s.dest, value), source))
    value, source = _home(selected)
    rows.append(("-", "EDGEFLEET_HOME", value, source))
    if selected is not None:
        for key in ("control_cert", "control_key", "password_file"):
            value = getattr(selected.context, key)
            if value:
                rows.append(("(control serve)", "-", value, f"context {selected.name} ({key})"))
    name = selected.name if selected else None
    if args.json:
        print_json(
            {
                "context": name,
                "chosen_by": selected.source if selected else None,
                "file": context_file.config_path(),
                "settings": [{"flag": f, "env": e, "value": v, "source": src} for f, e, v, src in rows],
            }
        )
        return
    title = f"context {name} ({selected.source}, {selected.path})" if selected else "no context (defaults)"
    print_table(title, ["flag", "variable", "value", "from"], rows)


def _home(selected: context_file.Selected | None) -> tuple[str, str]:
    import os

    from edgefleet.core.home import edgefleet_home

    if os.environ.get("EDGEFLEET_HOME"):
        return os.environ["EDGEFLEET_HOME"], "env EDGEFLEET_HOME"
    if selected is not None and selected.context.home:
        return selected.context.home, f"context {selected.name} (home)"
    return str(edgefleet_home()), "default"


def cmd_use(args: argparse.Namespace) -> None:
    path = context_file.config_path()
    config = context_file.load(path)
    if args.name not in config.contexts:
        raise UnknownNameError("context", args.name, config.contexts)
    context_file.save(config.model_copy(update={"current_context": args.name}), path)
    print(f"switched to context {args.name} ({path})")


def cmd_set(args: argparse.Namespace) -> None:
    path = context_file.config_path()
    config = context_file.load(path)
    keys = [k for k, _, _ in _KEYS]
    unknown = [k for k in args.unset if k not in keys]
    if unknown:
        raise UnknownNameError("context key", unknown[0], keys)
    current = config.contexts.get(args.name, context_file.Context()).model_dump()
    for key in keys:
        value = getattr(args, key)
        if value is None:
            continue
        if key in context_file.PATH_KEYS:
            value = str(Path(value).expanduser().resolve())
        elif key == "store":
            value = context_file.absolute_store(value, Path.cwd())
        current[key] = value
    for key in args.unset:
        current[key] = None
    try:
        context = context_file.Context.model_validate(current)
    except ValueError as err:
        raise UserInputError(f"context {args.name}: {err}") from err
    for key in ("ca", "cert", "key", "control_cert", "control_key"):
        value = getattr(context, key)
        if value and not Path(value).is_file():
            raise UserInputError(f"--{key.replace('_', '-')} {value}: no such file")
    if context.store:
        from edgefleet.control.store.url import has_password

        if has_password(context.store):
            print(
                f"warning: the store URL of context {args.name} holds a password; it is kept in {path} (0600) and "
                "shown redacted, but a password on a command line is seen in `ps`: prefer --password-file FILE, "
                "PGPASSFILE or PGPASSWORD (docs/scale-out.md)",
                file=sys.stderr,
            )
    contexts = {**config.contexts, args.name: context}
    current_name = args.name if (args.use or not config.current_context) else config.current_context
    context_file.save(config.model_copy(update={"contexts": contexts, "current_context": current_name}), path)
    print(f"context {args.name} saved in {path}" + ("; it is the current context" if current_name == args.name else ""))


def cmd_delete(args: argparse.Namespace) -> None:
    path = context_file.config_path()
    config = context_file.load(path)
    if args.name not in config.contexts:
        raise UnknownNameError("context", args.name, config.contexts)
    contexts = {n: c for n, c in config.contexts.items() if n != args.name}
    current = None if config.current_context == args.name else config.current_context
    context_file.save(config.model_copy(update={"contexts": contexts, "current_context": current}), path)
    print(f"deleted context {args.name} from {path}")
