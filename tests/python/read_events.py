"""Read a run directory's TensorBoard event files with TensorBoard's own reader and print what it found as JSON:
{"scalars": {tag: [[step, value], ...]}, "text": {tag: [markdown, ...]}}.

    python tests/python/read_events.py RUN_DIR

Used by cli/tests/observe.rs, which checks it against metrics.csv.
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator


def main(run_dir: str) -> None:
    acc = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    tags = acc.Tags()
    scalars = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in tags["scalars"]}
    text = {}
    for tag in tags["tensors"]:
        text[tag] = [b.decode() for e in acc.Tensors(tag) for b in e.tensor_proto.string_val]
    json.dump({"scalars": scalars, "text": text}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
