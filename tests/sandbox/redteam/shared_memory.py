"""Red team: state across cases without the disk. An anonymous shared mapping made when the
policy's module is imported would be inherited by every case forked after it; the cases' order
would then place each case in the public job order, and the corpus would give its fate. Now the
module is imported in each case's own process (a fresh mapping every case) and the cases run in
an unrecorded order: this plays the gate."""

import json
import mmap

from agents.scripted import FinalityGate
from finality_gym import load_corpus
from finality_gym.oracle import oracle_plan

SHARED = mmap.mmap(-1, 1 << 16)  # MAP_SHARED | MAP_ANONYMOUS
TASKS = load_corpus("public").tasks


class SharedMemory(FinalityGate):
    name = "redteam_shared_memory"

    def plan(self):
        raw = SHARED[:].split(b"\0", 1)[0]
        seen = json.loads(raw) if raw else []
        seen.append(self.brief.order_value)
        data = json.dumps(seen).encode()
        SHARED[:len(data) + 1] = data + b"\0"
        if len(seen) > 1:  # a history: line it up with the job order (one seed)
            index = len(seen) - 1
            if index < len(TASKS) and all(TASKS[i].order_value == v for i, v in enumerate(seen)):
                for call in oracle_plan(TASKS[index].fate):
                    yield call
                return
        yield from super().plan()
