"""The mirror's history decisions (mirror/history.py, sans-IO): where a worker taking a
partition resumes, and when records of a new leader epoch may be copied."""

from __future__ import annotations

import uuid

from mirror.history import (
    NO_EPOCH,
    Divergence,
    MirroredHistory,
    MirroredPosition,
    Resume,
    divergence_point,
    parse_topic_id,
    resume_point,
    topic_id_text,
)

A, B = uuid.UUID(int=1), uuid.UUID(int=2)


def test_topic_ids_in_kafkas_text_form_round_trip() -> None:
    tid = uuid.UUID("52dc7d91-9eaa-49a5-9baa-2a98bc26dff7")
    text = topic_id_text(tid)
    assert len(text) == 22 and "=" not in text
    assert parse_topic_id(text) == tid and parse_topic_id(text.encode()) == tid
    assert parse_topic_id(None) is None and parse_topic_id(b"") is None and parse_topic_id("@@") is None


def test_nothing_mirrored_yet_starts_at_the_log_start() -> None:
    assert resume_point(None, A, 40, 100) == Resume(40, NO_EPOCH)


def test_same_history_resumes_after_the_tail() -> None:
    tail = MirroredPosition(999, A, 3)
    assert resume_point(tail, A, 0, 1200, (3, 1200)) == Resume(1000, 3)
    assert resume_point(tail, A, 0, 1200, (3, 1000)) == Resume(1000, 3)  # epoch 3 ends right after it
    # Provenance written before topic ids and epochs: offsets alone, as before.
    assert resume_point(MirroredPosition(999, None, NO_EPOCH), A, 0, 1200) == Resume(1000, NO_EPOCH)


def test_a_source_that_lost_mirrored_records_is_a_divergence_and_its_new_records_are_mirrored() -> None:
    # Mirrored up to 999 in epoch 3; an unclean election left a leader whose epoch 3 ends at 800.
    got = resume_point(MirroredPosition(999, A, 3), A, 0, 1100, (3, 800))
    assert got == Resume(800, 3, divergence=Divergence(800, 999, 3, 3))
    assert got.divergence is not None and got.divergence.offsets == 200
    # The source never had epoch 3: its epoch 2 ends at 600, where the copy's epoch 3 began at
    # 500, so the copy and the source part at 500.
    got = resume_point(MirroredPosition(999, A, 3), A, 0, 1100, (2, 600), [(2, 0), (3, 500)])
    assert got == Resume(500, 2, divergence=Divergence(500, 999, 3, 2))
    # Without epochs in the provenance: a source that ends below the copy parted at its end.
    got = resume_point(MirroredPosition(999, None, NO_EPOCH), A, 0, 700)
    assert got == Resume(700, NO_EPOCH, divergence=Divergence(700, 999, NO_EPOCH, NO_EPOCH))


def test_an_answer_that_tells_nothing_is_no_divergence() -> None:
    assert divergence_point(1000, 3, [], -1, -1) is None
    assert divergence_point(1000, NO_EPOCH, [], 3, 10) is None
    assert divergence_point(1000, 3, [(3, -1)], 2, 900) == (900, 2)  # where epoch 3 began: not known


def test_a_new_incarnation_starts_at_its_log_start() -> None:
    assert resume_point(MirroredPosition(749, A, 0), B, 0, 500) == Resume(0, NO_EPOCH, new_incarnation=True)
    assert resume_point(MirroredPosition(749, A, 0), B, 30, 500) == Resume(30, NO_EPOCH, new_incarnation=True)


def test_records_deleted_before_they_were_mirrored_are_counted() -> None:
    assert resume_point(MirroredPosition(99, A, 0), A, 150, 400, (0, 400)) == \
        Resume(150, NO_EPOCH, lost_before_start=50)


def test_records_of_another_epoch_are_checked_first_and_a_divergence_rewinds() -> None:
    h = MirroredHistory()
    h.reset(A, NO_EPOCH)
    assert not h.needs_check(0)  # nothing known yet: the first epoch is taken as it comes
    h.mirrored(0, 0)
    assert (h.last_epoch, h.epoch_starts) == (0, [(0, 0)])
    assert not h.needs_check(0) and h.needs_check(1)
    assert h.divergence(500, 0, 500) is None  # epoch 0 ends at 500: the copy (to 499) holds
    h.mirrored(500, 1)
    h.mirrored(900, 2)
    assert h.epoch_starts == [(0, 0), (1, 500), (2, 900)]
    # The source's epoch 2 ended at 950, below the position 1000.
    d = h.divergence(1000, 2, 950)
    assert d == Divergence(950, 999, 2, 2)
    h.diverged(d)
    assert (h.last_epoch, h.epoch_starts) == (2, [(0, 0), (1, 500), (2, 900)])
    # The source's largest epoch at or below 2 is 1, ending at 700: the copy's epoch 2 (from
    # 900) and epoch 1 from 700 are gone.
    h.mirrored(950, 3)
    d = h.divergence(1200, 1, 700)
    assert d == Divergence(700, 1199, 3, 1)
    h.diverged(d)
    assert (h.last_epoch, h.epoch_starts) == (1, [(0, 0), (1, 500)])


def test_a_history_restored_from_the_tail_keeps_the_epochs_it_saw() -> None:
    h = MirroredHistory()
    h.reset(A, 4, [(2, 10), (3, 11), (4, 12)])
    assert h.epoch_starts == [(2, 10), (3, 11), (4, 12)]
    h.reset(A, 4, [])
    assert h.epoch_starts == [(4, -1)]
