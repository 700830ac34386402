"""`ttt-pipeline compare` of runs of different tasks: the two columns and no differences (issue 38)."""

from __future__ import annotations

from ttt_pipeline.io.runs import compare_summaries, format_compare, same_reviews, task_difference


def summary(run_id: str, task: dict, params: dict, acc: float) -> dict:
    return {"run_id": run_id, "run_name": run_id, "status": "FINISHED", "default_defense": "spell", "task": task,
            "metrics": {"acc_clean": acc, "acc_default": acc - 0.05}, "params": params, "registry": {},
            "differences": []}


DEMO = {"name": "ttt-demo-reviews-negative-positive", "labels": '["negative", "positive"]', "data_digest": "d1"}
MDSD = {"name": "ttt-mdsd-electronics-1-2-4-5", "labels": '["1", "2", "4", "5"]', "data_digest": "d2"}


def test_runs_of_different_tasks_show_two_columns_and_no_differences():
    a, b = summary("run-a", DEMO, {}, 0.79), summary("run-b", MDSD, {}, 0.55)
    c = compare_summaries(a, b)
    assert c["different_tasks"] == ["task: A=ttt-demo-reviews-negative-positive B=ttt-mdsd-electronics-1-2-4-5",
                                    """labels: A=["negative", "positive"] B=["1", "2", "4", "5"]"""]
    assert c["metrics"]["acc_clean"] == {"a": 0.79, "b": 0.55, "diff": None}
    c["paired"] = None
    out = format_compare(c)
    assert "A and B are runs of different tasks" in out and "B - A" not in out and "+" not in out.split("\n\n")[2]
    assert "no paired comparison" not in out and not same_reviews(a, b)


def test_runs_of_one_task_keep_their_differences_and_pair_only_on_the_same_reviews():
    a, b = summary("run-a", DEMO, {}, 0.79), summary("run-b", DEMO, {}, 0.81)
    c = compare_summaries(a, b)
    assert c["different_tasks"] == [] and c["metrics"]["acc_clean"]["diff"] == 0.81 - 0.79
    assert "B - A" in format_compare({**c, "paired": []}) and same_reviews(a, b)
    resplit = summary("run-c", {**DEMO, "data_digest": "other split"}, {}, 0.8)
    assert not task_difference(a, resplit) and not same_reviews(a, resplit)  # comparable, but not paired


def test_runs_logged_before_the_task_tags_are_told_apart_by_their_data_parameters():
    a = summary("run-a", {}, {"data.path": "/d/demo/reviews.jsonl", "data.label_names": "[1, 2]"}, 0.7)
    b = summary("run-b", {}, {"data.path": "/d/mdsd/electronics", "data.label_names": "[1, 2]"}, 0.7)
    assert task_difference(a, b) == ["data.path: A=/d/demo/reviews.jsonl B=/d/mdsd/electronics"]
