#!/usr/bin/env python3
"""Helpers of the container testnet scripts that are easier in Python than in
bash (the host may have no jq). Standard library only.

  tn.py status DIR [--from NAME] [--json]
      DIR holds what testnet/status.sh gathered: `containers` (lines of
      "NAME ID SERVICE ROLE SITE NAT STATE"), `routers` ("NAME status line"),
      `peers` ("NAME PEER-ID" remembered from earlier) and NAME.json, each
      node's `holopeer status --json`. Prints the swarm as one node (a
      bootstrap by default) sees it, every node's links as a matrix, and the
      facts e2e.sh checks; --json prints those facts as JSON.

  tn.py job NAME < jobs.json
      One line about job NAME from a node's GET /v1/jobs: "STEP STEPS STATE
      RECOVERIES REPLICAS" (replica peer ids comma-separated), or "- - - - -".

  tn.py steps FILE --steps N
      Checks a training step log. An apply/rollback log (JSON lines with
      "event": "apply" | "rollback", as `holopeer run` writes to steps.jsonl)
      is replayed: the committed history must be 1..N, each step applied
      after the one before it. Otherwise every step from 1 (or 0) to N must
      appear exactly once (JSON objects with a "step" field, or text lines
      starting "step N"). Prints one line; exit 1 if not intact.
"""

import argparse
import json
import os
import re
import signal
import sys


PRIVATE = re.compile(r"^/ip4/(10\.|127\.|192\.168\.|172\.(1[6-9]|2\d|3[01])\.)")


def show_addr(a):
    """A multiaddr without peer ids; a relay address as RELAY/p2p-circuit."""
    if "/p2p-circuit" in a:
        return a.split("/p2p/")[0] + "/p2p-circuit"
    return a.split("/p2p/")[0]


def addr_rank(a):
    """Public addresses first (what the peer looks like from the internet),
    then private ones, then relay addresses."""
    return 2 if "/p2p-circuit" in a else (1 if PRIVATE.match(a) else 0)


def short(pid):
    return "…" + pid[-6:] if pid else "?"


def load_dir(d):
    nodes, routers = {}, {}
    with open(os.path.join(d, "containers")) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 7:
                continue
            name, cid, svc, role, site, nat, state = parts[:7]
            entry = {"name": name, "id": cid, "service": svc, "role": role, "site": site, "nat": nat, "state": state, "status": None}
            if role == "router":
                routers[name] = entry
            else:
                nodes[name] = entry
    for name, n in nodes.items():
        p = os.path.join(d, name + ".json")
        if os.path.exists(p) and os.path.getsize(p) > 0:
            try:
                with open(p) as f:
                    n["status"] = json.load(f)
            except ValueError:
                n["status"] = None
    rp = os.path.join(d, "routers")
    if os.path.exists(rp):
        with open(rp) as f:
            for line in f:
                name, _, rest = line.strip().partition(" ")
                if name in routers:
                    routers[name]["line"] = rest
    names = {}
    pp = os.path.join(d, "peers")
    if os.path.exists(pp):
        with open(pp) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    names[parts[1]] = parts[0]
    for name, n in nodes.items():
        if n["status"] and n["status"].get("peer_id"):
            names[n["status"]["peer_id"]] = name
    return nodes, routers, names


def where(n):
    if n["site"] == "internet":
        return "internet"
    return "%s (%s)" % (n["site"], n["nat"])


def facts(nodes, routers, names, viewpoint):
    """The facts status prints and e2e checks."""
    links = {}  # (a, b) sorted -> set of conn kinds reported by either side
    for name, n in nodes.items():
        st = n["status"]
        if not st:
            continue
        for p in st.get("peers") or []:
            other = names.get(p.get("peer_id"), short(p.get("peer_id")))
            key = tuple(sorted((name, other)))
            links.setdefault(key, set()).add(p.get("conn") or "?")

    def kind(kinds):
        return "direct" if "direct" in kinds else ("relayed" if "relayed" in kinds else "?")

    direct_cross, relayed_sym = [], []
    for (a, b), kinds in sorted(links.items()):
        na, nb = nodes.get(a), nodes.get(b)
        if not na or not nb:
            continue
        k = kind(kinds)
        behind = na["site"] != "internet" and nb["site"] != "internet"
        if k == "direct" and behind and na["site"] != nb["site"]:
            direct_cross.append([a, b])
        if k == "relayed" and "symmetric" in (na["nat"], nb["nat"]):
            relayed_sym.append([a, b])

    vp = nodes.get(viewpoint) or {}
    vst = vp.get("status") or {}
    seen = {names.get(p.get("peer_id"), short(p.get("peer_id"))) for p in vst.get("peers") or []}
    expected = [n for n in nodes if n != viewpoint]
    coord = vst.get("coordinator")
    coords = {}
    for name, n in nodes.items():
        c = (n["status"] or {}).get("coordinator")
        if c and c.get("peer_id"):
            coords.setdefault(c["peer_id"], {"peer_id": c["peer_id"], "name": names.get(c["peer_id"], short(c["peer_id"])), "term": c.get("term"), "followers": []})
            coords[c["peer_id"]]["followers"].append(name)
    return {
        "viewpoint": viewpoint,
        "swarm": vst.get("swarm"),
        "nodes": len(nodes),
        "answering": sorted(n for n, v in nodes.items() if v["status"]),
        "not_answering": sorted(n for n, v in nodes.items() if not v["status"]),
        "seen_by_viewpoint": sorted(seen),
        "missing_from_viewpoint": sorted(n for n in expected if n not in seen),
        "coordinator": None if not coord else {"peer_id": coord.get("peer_id"), "name": names.get(coord.get("peer_id"), short(coord.get("peer_id"))), "term": coord.get("term"), "insecure": coord.get("insecure")},
        "coordinators_followed": sorted(coords.values(), key=lambda c: (-(c["term"] or 0), c["name"])),
        "following_none": sorted(n for n, v in nodes.items() if v["status"] and not v["status"].get("coordinator")),
        "direct_cross_router": direct_cross,
        "relayed_symmetric": relayed_sym,
        "links": {"%s|%s" % k: kind(v) for k, v in sorted(links.items())},
    }


def table(rows):
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def print_status(nodes, routers, names, f):
    vp = nodes.get(f["viewpoint"]) or {}
    vst = vp.get("status") or {}
    print("holopeer testnet, swarm %s, as %s sees it" % (f["swarm"] or "?", f["viewpoint"]))
    c = f["coordinator"]
    if c:
        print("coordinator  %s (%s) term %s%s" % (c["name"], short(c["peer_id"]), c["term"], "  INSECURE sim TEE: testnets only" if c.get("insecure") else ""))
    else:
        print("coordinator  none")
    bypeer = {p.get("peer_id"): p for p in vst.get("peers") or []}
    rows = [("NODE", "WHERE", "STATE", "PEER", "CONN", "REACH", "MAPPING", "PUNCH", "ADDRESS")]
    for name in sorted(nodes):
        n = nodes[name]
        st = n["status"] or {}
        pid = st.get("peer_id") or next((k for k, v in names.items() if v == name), "")
        p = bypeer.get(pid)
        if name == f["viewpoint"]:
            conn = "(self)"
        elif p:
            conn = p.get("conn") or "?"
        else:
            conn = "-"
        addrs = sorted((show_addr(a) for a in ((p or {}).get("addrs") or st.get("addrs") or []) if "/127.0.0.1/" not in a), key=addr_rank)
        state = n["state"] if n["status"] or n["state"] != "running" else "no answer"
        nat = st.get("nat") or {}
        mapping = ",".join("%s:%s" % (k, v.replace("endpoint-", "")) for k, v in sorted((nat.get("mapping") or {}).items())) or "-"
        punches = nat.get("hole_punch") or []
        ok = sum(1 for h in punches if h.get("success"))
        punch = "%d/%d" % (ok, len(punches)) if punches else "-"
        rows.append((name, where(n), state, short(pid) if pid else "?", conn, st.get("reachability") or "?", mapping, punch, addrs[0] if addrs else ""))
    known = set(names)
    for pid, p in bypeer.items():
        if pid not in known:
            rows.append(("?", "?", "?", short(pid), p.get("conn") or "?", "?", "", "", show_addr((p.get("addrs") or [""])[0])))
    print(table(rows))

    live = [n for n in sorted(nodes) if nodes[n]["status"]]
    if live:
        print("\nlinks as each node reports them (D direct, R relayed, . none):")
        rows = [[""] + live]
        for a in live:
            row = [a]
            for b in live:
                if a == b:
                    row.append("-")
                    continue
                k = f["links"].get("%s|%s" % tuple(sorted((a, b))))
                row.append({"direct": "D", "relayed": "R"}.get(k, "."))
            rows.append(row)
        print(table(rows))

    print("\nMAPPING is the NAT mapping each node measured for itself, PUNCH its hole punches (succeeded/tried).")
    print("direct across routers:      %s" % (", ".join("%s<->%s" % tuple(p) for p in f["direct_cross_router"]) or "none"))
    print("relayed, symmetric router:  %s" % (", ".join("%s<->%s" % tuple(p) for p in f["relayed_symmetric"]) or "none"))
    if f["missing_from_viewpoint"]:
        print("not seen by %s:  %s" % (f["viewpoint"], " ".join(f["missing_from_viewpoint"])))
    if f["coordinator"] and f["following_none"]:
        print("following no coordinator:  %s" % " ".join(f["following_none"]))
    if len(f["coordinators_followed"]) > 1:
        print("WARNING nodes follow different coordinators: %s" % "; ".join("%s term %s by %s" % (c["name"], c["term"], ",".join(c["followers"])) for c in f["coordinators_followed"]))
    for name in sorted(routers):
        print("%-9s %s" % (name, routers[name].get("line", routers[name]["state"])))


def cmd_status(args):
    nodes, routers, names = load_dir(args.dir)
    vp = args.vfrom
    if not vp:
        vp = next((n for n in ("boot-1", "boot-2") if n in nodes and nodes[n]["status"]), None)
        vp = vp or next((n for n in sorted(nodes) if nodes[n]["status"]), "boot-1")
    f = facts(nodes, routers, names, vp)
    if args.json:
        json.dump(f, sys.stdout, indent=2)
        print()
    else:
        print_status(nodes, routers, names, f)
    return 0


# A text step log line starts with "step N" (a JSON line has a "step" field);
# other lines that merely mention a step (a checkpoint note) are not entries.
STEP_TEXT = re.compile(r"^\s*step[\s=:#]+(\d+)\b", re.I)


def cmd_steps(args):
    entries = []  # (kind, step): kind "apply", "rollback" or "step"
    with open(args.file, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("{"):
                try:
                    obj = json.loads(line)
                except ValueError:
                    obj = None
                if isinstance(obj, dict) and isinstance(obj.get("step"), int):
                    kind = obj.get("event", obj.get("type", obj.get("kind", "step")))
                    # Only step records count; a checkpoint or eval event
                    # naming its step is not a second entry for it.
                    if kind in ("step", "apply", "rollback"):
                        entries.append((kind, obj["step"]))
                continue
            m = STEP_TEXT.search(line)
            if m:
                entries.append(("step", int(m.group(1))))
    if not entries:
        print("step log: no steps found in %s" % args.file)
        return 1
    if any(k in ("apply", "rollback") for k, _ in entries):
        return check_replay(entries, args.steps)
    seen = [s for _, s in entries]
    first = 0 if 0 in seen else 1
    want = list(range(first, args.steps + first))
    dups = sorted({s for s in seen if seen.count(s) > 1})
    missing = sorted(set(want) - set(seen))
    extra = sorted(set(seen) - set(want))
    ok = not dups and not missing and not extra
    print("step log: %d entries, steps %d..%d%s%s%s -> %s" % (
        len(seen), min(seen), max(seen),
        ", duplicated %s" % dups[:10] if dups else "",
        ", missing %s" % missing[:10] if missing else "",
        ", unexpected %s" % extra[:10] if extra else "",
        "intact" if ok else "NOT intact"))
    return 0 if ok else 1


def check_replay(entries, steps):
    """An apply/rollback log (stage/pipeline's step log): replayed, every
    apply must follow the step before it, a rollback to c undoes what came
    after c, and the committed history must be 1..steps."""
    cur, committed, rollbacks, err = 0, [], 0, None
    for i, (kind, s) in enumerate(entries):
        if kind == "apply":
            if s != cur + 1:
                err = "entry %d: step %d applied after step %d" % (i + 1, s, cur)
                break
            cur = s
            committed.append(s)
        elif kind == "rollback":
            rollbacks += 1
            if s > cur and not committed:
                committed, cur = list(range(1, s + 1)), s  # joined from a checkpoint
                continue
            if s > cur:
                err = "entry %d: rollback to step %d, ahead of step %d" % (i + 1, s, cur)
                break
            cur = s
            committed = committed[:s]
        else:
            err = "entry %d: a plain step record in an apply/rollback log" % (i + 1)
            break
    if err is None and committed != list(range(1, len(committed) + 1)):
        err = "committed history is not 1..%d" % len(committed)
    if err is None and len(committed) != steps:
        err = "committed %d steps, the job has %d" % (len(committed), steps)
    applies = sum(1 for k, _ in entries if k == "apply")
    print("step log: %d applies, %d rollbacks, committed steps 1..%d -> %s" % (
        applies, rollbacks, len(committed), "intact" if err is None else "NOT intact: " + err))
    return 0 if err is None else 1


def cmd_job(args):
    """One line about job NAME from a node's GET /v1/jobs on stdin:
    "STEP STEPS STATE RECOVERIES REPLICA,REPLICA,..." ("- - - - -" if absent)."""
    try:
        jobs = json.load(sys.stdin) or []
    except ValueError:
        jobs = []
    jobs = [j for j in jobs if isinstance(j, dict) and j.get("name") == args.name and j.get("kind", "train") == "train"]
    if not jobs:
        print("- - - - -")
        return 0
    j = max(jobs, key=lambda j: j.get("updated") or "")
    replicas = [r for st in j.get("stages") or [] for r in st.get("replicas") or []]
    print("%d %d %s %d %s" % (j.get("step") or 0, j.get("steps") or 0, j.get("state") or "?", j.get("recoveries") or 0, ",".join(replicas) or "-"))
    return 0


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    ap = argparse.ArgumentParser(prog="tn.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("status")
    s.add_argument("dir")
    s.add_argument("--from", dest="vfrom")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)
    t = sub.add_parser("steps")
    t.add_argument("file")
    t.add_argument("--steps", type=int, required=True)
    t.set_defaults(fn=cmd_steps)
    j = sub.add_parser("job")
    j.add_argument("name")
    j.set_defaults(fn=cmd_job)
    args = ap.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
