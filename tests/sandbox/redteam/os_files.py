"""Red team, the operating system: leave files that later cases read.

Every case looks for a marker an earlier case left, then leaves its own, in each of the places a
process of this user can usually write: /tmp, /dev/shm, /dev (root's), $TMPDIR (the sandbox's
scratch folder), $HOME, the working directory, and the folder of its own file. A case that finds an earlier case's marker ships, one that does not
refunds: with any place persisting across cases, every case of a worker but the first ships (a
policy that remembers can pair the two halves of a twin pair).

The test (tests/sandbox/test_sandbox.py) copies this file beside its run and bakes `TOKEN` (a random
name part, so that no other run's markers count) into `CONFIG`. The markers are
`finality-redteam-TOKEN` in each place (`.finality-redteam-TOKEN` in $HOME); `places()` lists
them, and the test removes them afterwards.
"""

import os

from finality_gym.policy import Policy

CONFIG: dict = {}  # the test bakes its values in here


def places() -> dict[str, str]:
    """Where this case would leave its marker, by name of the place."""
    token = CONFIG.get("TOKEN", "default")
    name = f"finality-redteam-{token}"
    found = {"tmp": os.path.join("/tmp", name), "shm": os.path.join("/dev/shm", name),
             "dev": os.path.join("/dev", name)}
    tmpdir = os.environ.get("TMPDIR")
    if tmpdir and os.path.realpath(tmpdir) != "/tmp":
        found["tmpdir"] = os.path.join(tmpdir, name)
        # a folder whose owner took every permission away: a cleaner that does not give them
        # back first cannot remove it
        found["locked"] = os.path.join(tmpdir, name + "-locked")
    home = os.environ.get("HOME")
    if home:
        found["home"] = os.path.join(home, "." + name)
    try:
        found["cwd"] = os.path.join(os.getcwd(), name)
    except OSError:
        pass
    found["beside"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    return found


class Persist(Policy):
    name = "redteam_os_files"

    def plan(self):
        marked = places()
        earlier = [place for place, path in marked.items() if os.path.exists(path)]
        for place, path in marked.items():
            try:
                if place == "locked":  # a folder with a folder in it, then no permission
                    os.makedirs(os.path.join(path, "deeper"), exist_ok=True)
                    os.chmod(path, 0)
                    continue
                with open(path, "a") as f:
                    f.write(f"{os.getpid()}\n")
            except OSError:
                pass
        yield ("ship", {}) if earlier else ("refund", {})
