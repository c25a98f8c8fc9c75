"""The coordinator's registry of labs: one directory, one participant id per lab, bound to its two keys.

Runs in hacfed-server (`register`, `revoke`, and the SuperNode key sync of `hacfed.server.node_auth`)
and in the ServerApp's round driver (`hacfed.server.membership` reads it at every round).

    KEYS/<participant-id>.pub            the lab's Ed25519 signing key (PEM): its envelopes and hello
    KEYS/supernodes/<participant-id>.pub the lab's SuperNode key (OpenSSH line): Flower's node auth
    KEYS/revoked/<id>-<UTC time>/        revoked keys, kept so they can never be registered again
    KEYS/enrolled/<id>-<fingerprint>/    every pair of keys ever registered (signing.pub, supernode.pub)

KEYS is `<state-dir>/keys` unless hacfed-server is given --keys-dir. A lab is registered when its
`<id>.pub` exists (`register` writes the SuperNode key first, the signing key last, each file
atomically, then its record in `enrolled/`); TLS deployments also need its SuperNode key.
Registration is out of band (T5): the operator runs `hacfed-server register` with the lab's
enrolment line (`hacfed.enrolment`) after comparing fingerprints with the lab.

`hacfed-server revoke` is how a lab is taken out: it moves the lab's keys to `revoked/` and audits
it. Deleting a lab's key files by hand also takes it out (the registry is re-read), but records
nothing; the `enrolled/` record still keeps its keys from being registered again (a key that was
registered and no longer is, for whatever reason, is refused), and `revoke` run afterwards writes
the revocation record and the audit line from it (its folder then holds `deleted-by-hand`).

Reading is tolerant and fail-closed per entry: a file whose name is not a valid participant id, an
unreadable key, or a key registered under two ids makes that entry (both ids, for a shared key)
unregistered and is reported in `Registry.problems`, never a crash of the reader; the ids are shown
with `hacfed.identity.printable`.
"""

from __future__ import annotations

import datetime
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hacfed.enrolment import (
    Enrolment,
    load_supernode_public_text,
    supernode_fingerprint,
    supernode_key_hash,
    supernode_public_text,
)
from hacfed.envelope import EnvelopeError, key_id, load_public_key, save_public_key, write_atomic
from hacfed.identity import check_participant_id, is_participant_id, printable
from hacfed.keys import fingerprint
from hacfed.wire import ErrorCode

SUFFIX = ".pub"
SUPERNODES_DIR = "supernodes"
REVOKED_DIR = "revoked"
ENROLLED_DIR = "enrolled"
DELETED_BY_HAND = "deleted-by-hand"  # in a revoked/ folder written from enrolled/: nothing was moved


@dataclass(frozen=True)
class Entry:
    participant_id: str
    signing_key: Ed25519PublicKey
    supernode_key: ec.EllipticCurvePublicKey | None
    supernode_path: Path | None

    @property
    def supernode_hash(self) -> str | None:
        return None if self.supernode_key is None else supernode_key_hash(self.supernode_key)


@dataclass(frozen=True)
class Registry:
    """The registered labs. `keys` is what `open_envelope` trusts; `owners` names each key's lab."""

    entries: Mapping[str, Entry] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    @property
    def keys(self) -> dict[bytes, Ed25519PublicKey]:
        return {key_id(e.signing_key): e.signing_key for e in self.entries.values()}

    @property
    def owners(self) -> dict[bytes, str]:
        return {key_id(e.signing_key): pid for pid, e in self.entries.items()}

    def owner(self, kid: bytes) -> str:
        owners = self.owners
        if kid not in owners:
            raise EnvelopeError(ErrorCode.UNAUTHENTICATED, f"key {kid.hex()[:16]!r}... is not registered")
        return owners[kid]


def _pub_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(SUFFIX) and p.is_file())
    except FileNotFoundError:
        return []


def signature(keys_dir: Path) -> tuple:
    """Changes whenever a registration or revocation happened (cheap: a few stat calls)."""
    out = []
    for directory in (Path(keys_dir), Path(keys_dir) / SUPERNODES_DIR):
        for path in _pub_files(directory):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            out.append((str(path), st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


def load_registry(keys_dir: Path) -> Registry:
    keys_dir = Path(keys_dir)
    problems: list[str] = []
    signing: dict[str, Ed25519PublicKey] = {}
    for path in _pub_files(keys_dir):
        pid = path.name[: -len(SUFFIX)]
        if not is_participant_id(pid):
            problems.append(f"ignored {printable(path.name)} in {keys_dir}: not a valid participant id")
            continue
        try:
            signing[pid] = load_public_key(path)
        except (OSError, ValueError) as exc:
            problems.append(f"ignored the key of {pid}: {exc}")
    shared = _shared(signing, lambda k: key_id(k))
    supernode: dict[str, tuple[ec.EllipticCurvePublicKey, Path]] = {}
    for path in _pub_files(keys_dir / SUPERNODES_DIR):
        pid = path.name[: -len(SUFFIX)]
        if not is_participant_id(pid):
            problems.append(f"ignored {printable(path.name)} in {keys_dir / SUPERNODES_DIR}: "
                            "not a valid participant id")
            continue
        try:
            supernode[pid] = (load_supernode_public_text(path.read_text(encoding="ascii"), str(path)), path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            problems.append(f"ignored the SuperNode key of {pid}: {exc}")
            shared.add(pid)  # a lab whose SuperNode key is unreadable is not half-registered
    shared |= _shared({p: k for p, (k, _) in supernode.items()}, supernode_key_hash)
    for pid in sorted(shared & set(signing)):
        problems.append(f"refused {pid}: a key of it is also registered for another participant, or unreadable")
    entries = {pid: Entry(pid, key, *supernode.get(pid, (None, None)))
               for pid, key in signing.items() if pid not in shared}
    return Registry(entries, tuple(problems))


def _shared(keys: Mapping[str, object], ident) -> set[str]:  # noqa: ANN001 - key -> hashable id
    seen: dict[object, list[str]] = {}
    for pid, key in keys.items():
        seen.setdefault(ident(key), []).append(pid)
    return {pid for pids in seen.values() if len(pids) > 1 for pid in pids}


# ---- what the operator does -----------------------------------------------------------------------


def _key_hashes(keys_dir: Path, kind: str) -> tuple[set[bytes], set[str]]:
    """Signing key ids and SuperNode key hashes of every `<kind>/*/` record (revoked or enrolled)."""
    signing, supernode = set(), set()
    for path in (Path(keys_dir) / kind).glob(f"*/*{SUFFIX}"):
        try:
            if path.name == "signing.pub":
                signing.add(key_id(load_public_key(path)))
            elif path.name == "supernode.pub":
                supernode.add(supernode_key_hash(load_supernode_public_text(path.read_text(encoding="ascii"), "")))
        except (OSError, ValueError, UnicodeDecodeError):
            continue
    return signing, supernode


def register(keys_dir: Path, enrolment: Enrolment) -> Entry:
    """Register a lab from its (checked) enrolment. Idempotent for the same keys; refuses an id that
    is registered with other keys, a key registered for another id, and a key that was registered
    before and no longer is (revoked, or its files deleted by hand)."""
    keys_dir = Path(keys_dir)
    pid = check_participant_id(enrolment.participant_id)
    registry = load_registry(keys_dir)
    kid, node_hash = key_id(enrolment.signing_key), supernode_key_hash(enrolment.supernode_key)
    current = registry.entries.get(pid)
    if current is not None:
        if key_id(current.signing_key) == kid and current.supernode_hash == node_hash:
            _record_enrolment(keys_dir, enrolment)  # repairs a registration cut off before its record
            return current
        raise ValueError(f"{pid} is already registered with other keys; revoke it first "
                         f"(hacfed-server revoke {pid}) if the lab really has new keys")
    for other in registry.entries.values():
        if key_id(other.signing_key) == kid or other.supernode_hash == node_hash:
            raise ValueError(f"a key of this enrolment is already registered for {other.participant_id}")
    rotate = (f"the lab must create new keys (hacfed-client keys --state-dir DIR --participant-id {pid} --rotate) "
              "and enrol again")
    revoked_signing, revoked_nodes = _key_hashes(keys_dir, REVOKED_DIR)
    if kid in revoked_signing or node_hash in revoked_nodes:
        raise ValueError(f"a key of this enrolment was revoked before; {rotate}")
    enrolled_signing, enrolled_nodes = _key_hashes(keys_dir, ENROLLED_DIR)
    if kid in enrolled_signing or node_hash in enrolled_nodes:
        raise ValueError(f"a key of this enrolment was registered before and its key files were removed without "
                         f"hacfed-server revoke, which still takes it out for good; {rotate} (run hacfed-server revoke "
                         f"{pid} to record the revocation)")
    (keys_dir / SUPERNODES_DIR).mkdir(parents=True, exist_ok=True)
    node_path = keys_dir / SUPERNODES_DIR / f"{pid}{SUFFIX}"
    write_atomic(node_path, (supernode_public_text(enrolment.supernode_key) + "\n").encode("ascii"), 0o644)
    save_public_key(enrolment.signing_key, keys_dir / f"{pid}{SUFFIX}")  # now it is registered
    _record_enrolment(keys_dir, enrolment)
    return Entry(pid, enrolment.signing_key, enrolment.supernode_key, node_path)


def _enrolled_folder(keys_dir: Path, participant_id: str, signing_key: Ed25519PublicKey) -> Path:
    return Path(keys_dir) / ENROLLED_DIR / f"{participant_id}-{fingerprint(signing_key)}"


def _record_enrolment(keys_dir: Path, enrolment: Enrolment) -> None:
    folder = _enrolled_folder(keys_dir, enrolment.participant_id, enrolment.signing_key)
    if (folder / "signing.pub").exists() and (folder / "supernode.pub").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    supernode_text = supernode_public_text(enrolment.supernode_key) + "\n"
    write_atomic(folder / "supernode.pub", supernode_text.encode("ascii"), 0o644)
    save_public_key(enrolment.signing_key, folder / "signing.pub")
    _fsync_dir(folder.parent)


def unregister(keys_dir: Path, entry: Entry) -> None:
    """Undo a `register` that just happened (its audit line could not be written): files and record."""
    keys_dir = Path(keys_dir)
    name = f"{entry.participant_id}{SUFFIX}"
    for path in (keys_dir / name, keys_dir / SUPERNODES_DIR / name):
        path.unlink(missing_ok=True)
    shutil.rmtree(_enrolled_folder(keys_dir, entry.participant_id, entry.signing_key), ignore_errors=True)


def register_signing_key(keys_dir: Path, participant_id: str, public_key: Ed25519PublicKey) -> Path:
    """Write `<keys_dir>/<participant_id>.pub` only (insecure development deployments, trust on first
    use); refuses an invalid id and a different key for a registered id."""
    pid = check_participant_id(participant_id)
    path = Path(keys_dir) / f"{pid}{SUFFIX}"
    if path.resolve().parent != Path(keys_dir).resolve():
        raise ValueError(f"{printable(participant_id)} would leave the keys directory")
    if path.exists():
        if key_id(load_public_key(path)) != key_id(public_key):
            raise ValueError(f"{path} already holds another key for {pid}")
        return path
    save_public_key(public_key, path)
    return path


def revoke(keys_dir: Path, participant_id: str, *, now: datetime.datetime | None = None) -> Path:
    """Move the lab's keys to `revoked/<id>-<UTC time>/`; returns that folder. For a lab whose key
    files were deleted by hand, the folder gets the keys of its `enrolled/` records not revoked yet."""
    keys_dir = Path(keys_dir)
    pid = check_participant_id(participant_id)
    signing, node = keys_dir / f"{pid}{SUFFIX}", keys_dir / SUPERNODES_DIR / f"{pid}{SUFFIX}"
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y%m%dT%H%M%S%fZ")
    target = keys_dir / REVOKED_DIR / f"{pid}-{stamp}"
    if not signing.exists() and not node.exists():
        return _revoke_deleted(keys_dir, pid, target)
    target.mkdir(parents=True)
    if signing.exists():  # first: from this rename on, the lab is no longer registered
        os.replace(signing, target / "signing.pub")
    if node.exists():
        os.replace(node, target / "supernode.pub")
    _fsync_dir(keys_dir)
    return target


def _revoke_deleted(keys_dir: Path, pid: str, target: Path) -> Path:
    revoked_signing, _ = _key_hashes(keys_dir, REVOKED_DIR)
    pending = []
    for folder in sorted((keys_dir / ENROLLED_DIR).glob(f"{pid}-*")):
        try:
            same_lab = folder.name.rsplit("-", 1)[0] == pid
            if same_lab and key_id(load_public_key(folder / "signing.pub")) not in revoked_signing:
                pending.append(folder)
        except (OSError, ValueError):
            continue
    if not pending:
        raise ValueError(f"{pid} is not registered in {keys_dir}")
    for index, folder in enumerate(pending):
        record = target if index == 0 else target.with_name(f"{target.name}-{index}")
        record.mkdir(parents=True)
        for name in ("signing.pub", "supernode.pub"):
            if (folder / name).exists():
                shutil.copy2(folder / name, record / name)
        (record / DELETED_BY_HAND).write_text("its key files were deleted by hand before this revocation\n")
    _fsync_dir(target.parent)
    return target


def unrevoke(keys_dir: Path, participant_id: str, folder: Path) -> None:
    """Undo a `revoke` that just happened (its audit line could not be written)."""
    keys_dir = Path(keys_dir)
    if not (folder / DELETED_BY_HAND).exists():  # keys were moved: move them back
        if (folder / "supernode.pub").exists():
            os.replace(folder / "supernode.pub", keys_dir / SUPERNODES_DIR / f"{participant_id}{SUFFIX}")
        if (folder / "signing.pub").exists():
            os.replace(folder / "signing.pub", keys_dir / f"{participant_id}{SUFFIX}")
    for record in folder.parent.glob(f"{folder.name}*"):
        if record == folder or record.name.startswith(f"{folder.name}-"):
            shutil.rmtree(record, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe(entry: Entry) -> str:
    node = "no SuperNode key" if entry.supernode_key is None else \
        f"SuperNode key {supernode_fingerprint(entry.supernode_key)}"
    return f"{entry.participant_id}: signing key {fingerprint(entry.signing_key)}, {node}"
