"""A note-level metric for basic-pitch, as a user who transcribes music would write it: the notes each output
decodes to, matched as mir_eval matches transcriptions (same pitch, onsets within 50 ms), scored by F1 against the
FP32 model's notes.

basic-pitch's `nmp.onnx` gives, per 2-second window, three maps over 172 frames (86.13 frames/s): the pitch
contour (264 bins), the note frames and the onsets (88 keys each). Notes are decoded as basic-pitch's own
post-processing does it, simplified: an onset is a frame whose onset probability is at least ONSET_THRESHOLD and a
peak in time; the note lasts while its frames stay at least FRAME_THRESHOLD; notes shorter than MIN_FRAMES are
dropped (basic-pitch's defaults: 0.5, 0.3 and 127.7 ms).

Used as `--metric bench/task_metrics/notes.py:note_f1` (bench/default_rules.py).
"""

from __future__ import annotations

import numpy as np

ONSET_THRESHOLD, FRAME_THRESHOLD = 0.5, 0.3
MIN_FRAMES = 11  # 127.7 ms at 86.13 frames/s
ONSET_TOLERANCE = 4  # frames: 46 ms (mir_eval's onset tolerance is 50 ms)
FRAMES_OUTPUT, ONSETS_OUTPUT = "StatefulPartitionedCall:1", "StatefulPartitionedCall:2"


def notes(frames: np.ndarray, onsets: np.ndarray) -> list[tuple[int, int, int]]:
    """(key, onset frame, end frame) of each note in one window's maps, both [frames, 88]."""
    found = []
    count = len(onsets)
    for key in range(onsets.shape[1]):
        track, frame_track = onsets[:, key], frames[:, key]
        for t in range(count):
            value = track[t]
            if value < ONSET_THRESHOLD:
                continue
            if (t > 0 and track[t - 1] > value) or (t + 1 < count and track[t + 1] >= value):
                continue  # not the peak of its onset
            end = t + 1
            while end < count and frame_track[end] >= FRAME_THRESHOLD:
                end += 1
            if end - t >= MIN_FRAMES:
                found.append((key, t, end))
    return found


def _matches(reference: list[tuple[int, int, int]], candidate: list[tuple[int, int, int]]) -> int:
    """Greedy one-to-one matching by key and onset (closest onsets first)."""
    pairs = sorted(
        (abs(r[1] - c[1]), i, j)
        for i, r in enumerate(reference)
        for j, c in enumerate(candidate)
        if r[0] == c[0] and abs(r[1] - c[1]) <= ONSET_TOLERANCE
    )
    used_r: set[int] = set()
    used_c: set[int] = set()
    for _distance, i, j in pairs:
        if i not in used_r and j not in used_c:
            used_r.add(i)
            used_c.add(j)
    return len(used_r)


def note_f1(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], labels: object) -> float:
    """F1 of the candidate's notes against FP32's, over every window of the evaluation set (1.0 when neither has
    a note)."""
    ref_count = cand_count = matched = 0
    ref_frames = reference[FRAMES_OUTPUT].reshape(-1, *reference[FRAMES_OUTPUT].shape[-2:])
    ref_onsets = reference[ONSETS_OUTPUT].reshape(ref_frames.shape)
    cand_frames = candidate[FRAMES_OUTPUT].reshape(ref_frames.shape)
    cand_onsets = candidate[ONSETS_OUTPUT].reshape(ref_frames.shape)
    for i in range(len(ref_frames)):
        ref_notes = notes(ref_frames[i], ref_onsets[i])
        cand_notes = notes(cand_frames[i], cand_onsets[i])
        ref_count, cand_count = ref_count + len(ref_notes), cand_count + len(cand_notes)
        matched += _matches(ref_notes, cand_notes)
    if ref_count + cand_count == 0:
        return 1.0
    return 2.0 * matched / (ref_count + cand_count)
