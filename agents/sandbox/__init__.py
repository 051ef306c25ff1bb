"""The operating-system sandbox an outside policy runs in: bubblewrap around its process, and a pid
namespace, no capability, a seccomp filter and limits around every case.

Two layers, because the grade must hold against code that attacks the machine, not only Python
(docs/trust.md):

1. The policy's process (`host.py`) runs under `bwrap` (bubblewrap: unprivileged user namespaces,
   no daemon, the sandbox of Flatpak): new user, pid, network, ipc, uts and cgroup namespaces, so
   it sees no process of the machine, no network (not even the loopback of the grader), no System V
   or POSIX IPC object of anyone else; capabilities dropped; the whole filesystem read-only and
   made of only what the policy needs (the interpreter and its site-packages, the repository's
   `agents/` and `finality_gym/`, the policy's own file or package); no `$HOME`, no results folder;
   the grader's environment never passed. Nothing there is writable by the policy's code, the
   scratch folder and /dev/shm included, so one chunk's fork server leaves nothing for the next.

2. The process the cases are forked from (the host's zygote, a fork server, one per chunk of work)
   takes, before the policy's import, a user and mount namespace of its own, a private tmpfs for
   what the import writes, the host's folder read-only, /proc hidden (the host reads the fork
   server's state from its own), a case's address-space limit, its own seccomp filter (no ptrace,
   no reading another process's memory or descriptors, no IPC object that outlives it, no new
   socket at all: its cases' channels are made before the filter, and the one listener is the
   host's; no pipe, memfd, pidfd, sysinfo or mount id, whose numbers are counters of the whole
   machine; no unmount; no query or eviction of the page cache) and no capability (`enter_worker`);
   every clone, fork and mount after that filter waits for the host's answer (`supervisor.py`).
   This is kernel state: the import, and the hooks it may leave in the fork server (which runs them
   before every fork), can change the fork server's memory, never this. After the import it enters
   the user namespace it made for its cases before the import, and a mount namespace of its own,
   where every mount made before the import is locked: nothing run there can uncover /proc
   (`isolate_worker`). Every case is two forks away from it: the first (`enter_case`) makes fresh
   pid and mount namespaces and mounts a fresh, size-capped tmpfs on the scratch folder
   (`/scratch`, the case's `$TMPDIR` and `$HOME`) and on `/dev/shm`, then forks the case as pid 1
   of its namespace and exits; the case (`restrict_case`) connects its channel to the host, keeps
   only that socket and the capped stderr relay, then takes limits (address space, file size, CPU
   time, open files), drops every capability and takes the case filter (no new process or thread,
   which the host refuses too: `supervisor.py`; no new socket; no System V or POSIX message-queue
   IPC object; no keyring, no ptrace, no mount, no namespace; no query or eviction of the page
   cache). Nothing of a writable place, not its times, modes, extended attributes or inode numbers,
   reaches the next case: each gets new ones. No socket, abstract or not, is shared between cases
   or with the fork server: none of them can listen.

   The host, which never imports the policy, checks every case from `/proc` before it hands it its
   brief (`case_problems`): pid 1 of a new pid namespace, a mount namespace of its own, exactly the
   expected mounts with its writable places on filesystems the fork server neither mounts nor holds
   open, no capability, the limits, one thread, only its own descriptors, no shared mapping that
   can be written, read-only or not (a case can make a read-only one writable with mprotect; a file
   opened read-only, which nothing can write, passes, as the C library's gconv cache in every
   process does). The steps above that run in the fork server's memory (the case's filter, say) a
   hostile import can undo; what the host checks, and the kernel state taken before the import, it
   cannot. The host ends each case by killing its pid namespace once the grader says the case
   ended, and refuses a policy whose import, or whose fork server, leaves any other process
   (`others`).

   The page cache is the machine's, and every case of every entry reads the same files (the
   interpreter, its libraries, the policy's own): which pages of a file are cached is state a case
   could set (a read caches a page, advice evicts it) and a later one read, in its chunk, in
   another chunk or entry, or in a later run. Both filters refuse what asks what is cached and what
   evicts (mincore, cachestat, fadvise, madvise's MADV_COLD, MADV_PAGEOUT and MADV_REMOVE,
   preadv2's RWF_NOWAIT and RWF_DONTCACHE, Linux AIO; `seccomp.py` says which and why). The fork
   server's holds for every case whatever the import rewrites. What is left: a case still caches
   what it reads, and a read from the disk takes longer (40-300 us against 1-3 us here: a later
   case that times its reads reads the bits). docs/trust.md says so.

   (A per-case user namespace and a seccomp filter built per case were measured at 11 ms a case and
   are made once in the fork server; a network namespace per case cost 1.5 ms more, and the fork
   server's filter does its work; fresh pid and mount namespaces and two tmpfs cost about 0.5 ms a
   case: `benchmarks/README.md`.)

Where each part lives: the bwrap command line, and where things are inside it, in `bwrap.py`; the
steps the fork server and the cases take (`enter_worker`, `isolate_worker`, `enter_case`,
`restrict_case`) in `isolation.py`, with the seccomp filters of `seccomp.py` and the answers to
their clones in `supervisor.py`; the host (`host.py`: the process `agents.sandbox.host` the grader
starts in `python -I`) and the fork server it runs the cases from (`fork_server.py`); the host's
checks from /proc (`case_problems`, `others`) in `case_checks.py`; the limits in `limits.py`; the
grader's side of the protocol (`ExternalPolicy`) in `external.py`; `unavailable()` in `bwrap.py`;
the self-test and the layers a run records in `self_test.py`.

What it may import: the standard library, `finality_gym` and, of the rest of `agents/`, only
`agents/spec.py` (the repository's root, a spec's import path). The host runs these modules in an
isolated interpreter under bwrap, where only `agents/` and `finality_gym/` are shown, and must
start without the grader or torch: importing any of them runs `agents/__init__.py` first, which
loads the factory, the spec, the registry, the scripted rules and `external.py`, never `eval/`,
`train/` or torch (`tests/test_layout.py` checks the host and the self-test). What imports it:
the factory (`ExternalPolicy`), the grader (`ExternalPolicy`, `self_test`), the board's loading
and verification and `eval show` (`ExternalPolicy`), the sandbox's tests and
`benchmarks/outside_policy.py`.
"""
