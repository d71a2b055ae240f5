"""The erasure commands:

- `memoryd forget --org ORG USER [--fact ID] [--reason R] [--actor A] [--request-id K]`
- `memoryd forget --resume` (finish the erasures a crash left open)
- `memoryd erasures --org ORG USER` (a memory's receipts), `memoryd erasures --open`
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from contextlib import closing
from typing import Any

from memoryd import wiring
from memoryd.analyst.commands import add_memory_arguments, memory_key
from memoryd.erasure import ErasureRequest
from memoryd.erasure_errors import UnknownFact
from memoryd.settings import Settings
from store.write.erasure_log import PendingErasure


def _not_blank(text: str) -> str:
    """An argument the erasure audit records: whitespace alone says nothing."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be blank")
    return text


def cmd_forget(settings: Settings, args: argparse.Namespace) -> int:
    """Erase a user's memory (or with --fact one fact) everywhere; prints the receipt."""
    if not args.resume and (args.user is None or args.org is None):
        print("memoryd forget: --org ORG USER is required (or --resume)", file=sys.stderr)
        return 2
    with wiring.core(settings) as c, closing(wiring.publisher(settings)) as pub:
        eraser = wiring.eraser(c, pub)
        if args.resume:
            receipts = eraser.resume_pending()
            print(json.dumps([r.to_json() for r in receipts], indent=2))
            return 0
        request = ErasureRequest(args.actor or settings.erasure.actor, args.reason, args.request_id)
        key = memory_key(args)
        if args.fact:
            try:
                receipt = eraser.erase_fact(key, args.fact, request)
            except UnknownFact as e:
                print(f"memoryd forget: {e}; nothing erased", file=sys.stderr)
                return 1
        else:
            receipt = eraser.forget(key, request)
    print(json.dumps(receipt.to_json(), indent=2))
    return 0


def cmd_erasures(settings: Settings, args: argparse.Namespace) -> int:
    """The stored receipts of a user's erasures, found by the keyed digest of their ids; with
    --open, every erasure started and not completed, whoever's (what MemorydErasureStuck is
    about: the memory's ids are held until it completes, to finish it)."""
    if args.open == (args.user is not None or args.org is not None):
        print("memoryd erasures: give --org ORG USER, or --open alone", file=sys.stderr)
        return 2
    if args.open:
        with wiring.core(settings) as c:
            pending = c.erasures.pending()
        print(json.dumps([_open_json(p) for p in pending], indent=2))
        return 0
    if args.user is None or args.org is None:
        print("memoryd erasures: --org ORG USER: both are needed", file=sys.stderr)
        return 2
    with wiring.core(settings) as c:
        records = c.erasures.receipts(c.subjects(memory_key(args)))
    doc = [
        {**r.receipt().to_json(), "status": r.status.value, "stored_digest": r.digest}
        for r in records
    ]
    print(json.dumps(doc, indent=2, default=str))
    return 0


def _open_json(p: PendingErasure) -> dict[str, Any]:
    return {
        "erasure_id": str(p.record.erasure_id),
        "scope": p.record.scope.value,
        "status": p.record.status.value,
        "requested_at": p.record.requested_at.isoformat(),
        "organization_id": p.key.organization_id,
        "user_id": p.key.user_id,
        "fact_id": None if p.fact_id is None else str(p.fact_id),
    }


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("forget", help="erase a user's memory (or one fact) everywhere")
    add_memory_arguments(p, required=False)
    p.add_argument(
        "--fact", type=uuid.UUID, help="erase only this fact (its id), not the whole memory"
    )
    p.add_argument(
        "--reason", type=_not_blank, default="erasure request", help="recorded in the erasure audit"
    )
    p.add_argument("--actor", type=_not_blank, help="who asked (recorded); default: erasure.actor")
    p.add_argument("--request-id", help="idempotency key: asked again, the same receipt")
    p.add_argument("--resume", action="store_true", help="finish erasures a crash left open")
    p.set_defaults(fn=cmd_forget)
    p = sub.add_parser("erasures", help="the receipts of a user's erasures, or those left open")
    add_memory_arguments(p, required=False)
    p.add_argument(
        "--open", action="store_true", help="every erasure started and not completed, whoever's"
    )
    p.set_defaults(fn=cmd_erasures)
