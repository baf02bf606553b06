"""What the course tools say to a student, in the student's language (English or Chinese).

``say(key, lang, **values)`` formats one message of :data:`MESSAGES`. The grader keeps its
gradebook messages in English (one language for the instructor's CSV); :func:`translate` turns
such a message into Chinese for a Chinese feedback page by its known English phrases. Diagnoses
keep their evidence (shapes, numbers) as written; the pitfall's name and fix come from the catalog.
"""

from __future__ import annotations

import re

__all__ = ["MESSAGES", "STATUS_NAMES", "say", "status_name", "translate"]

MESSAGES: dict[str, tuple[str, str]] = {
    # tinytf validate
    "header": ("tinytf validate {path}  (exercise {ex})", "tinytf validate {path}（练习 {ex}）"),
    "tests": ("Test cells (visible tests; the grader also runs hidden tests on fresh inputs):",
              "测试单元（可见测试；评分时还会在新的随机输入上运行隐藏测试）："),
    "tests_source": ("Test cells (an instructor source: every visible and hidden test, as written here):",
                     "测试单元（教师源笔记本：所有可见测试和隐藏测试，按这里写的运行）："),
    "points": ("{pts:g} pt", "{pts:g} 分"),
    "cell_error": ("error in your cell {what}", "你的单元出错：{what}"),
    "diagnosis": ("Diagnosis (tinytf.checks):", "诊断（tinytf.checks）："),
    "no_pitfall": ("no known pitfall detected in your functions", "没有在你的函数中发现已知陷阱"),
    "fix": ("Fix: {fix}", "修复：{fix}"),
    "evidence": ("{message}", "证据：{message}"),
    "result": ("Result: {verdict} — {passed} of {total} test cells pass ({pts:g} of {max:g} autograded points on the visible tests)",
               "结果：{verdict} —— {total} 个测试单元通过 {passed} 个（可见测试的自动评分 {max:g} 分中得 {pts:g} 分）"),
    "verdict_ok": ("OK", "通过"),
    "result_failed": ("Result: FAILED", "结果：未通过"),
    "verdict_failed": ("FAILED", "未通过"),
    "not_implemented": ("not implemented yet (a function it calls still raises NotImplementedError)",
                        "尚未实现（它调用的函数仍在抛出 NotImplementedError）"),
    "no_diagnosis": ("the diagnosis did not run (the kernel stopped before it)", "诊断没有运行（内核在它之前就停止了）"),
    "diagnosis_failed": ("the diagnosis failed: {error}", "诊断失败：{error}"),
    "no_release": ("no released version of this exercise was found to compare with; test cells were not checked",
                   "没有找到这份练习的发布版本，无法比对，测试单元未检查"),
    "stripped": ("the notebook has no nbgrader cell metadata (an editor stripped it?): the grader cannot find any test cell; "
                 "start again from the released exercise and copy your answers over",
                 "这个笔记本没有 nbgrader 单元元数据（被编辑器删掉了？），评分程序找不到任何测试单元；"
                 "请从发布的练习重新开始，再把你的答案复制过去"),
    "deleted": ("test cell {gid} was deleted or renamed: it is worth 0 when graded; copy it back from the released exercise",
                "测试单元 {gid} 被删除或改名：评分时记 0 分；请从发布的练习中把它复制回来"),
    "edited": ("test cell {gid} was edited: edited test cells earn 0 when graded; the released version was run here instead",
               "测试单元 {gid} 被修改：被修改的测试单元评分时记 0 分；这里运行的是发布版本"),
    "earlier_release": ("test cell {gid} comes from an earlier release of {ex}; today's version was run (graded normally)",
                        "测试单元 {gid} 来自 {ex} 的早期发布版本；这里运行的是今天的版本（正常评分）"),
    "cannot_read": ("cannot read {name}: {error}", "无法读取 {name}：{error}"),
    # a cell stopped for time (validate, the self-check, grade): slow is not wrong
    "stopped": ("{where} was stopped after {ran:.0f} s: the limit is {limit:g} s per cell. This is no error in your code, it was "
                "too slow here. Set fast = True in the parameters cell, use fewer steps, or give it longer: "
                "tinytf validate --timeout 300 {path}",
                "{where} 运行了 {ran:.0f} 秒后被停止：每个单元的时间限制是 {limit:g} 秒。这不是你代码里的错误，只是它在这里太慢。"
                "请在 parameters 单元里设 fast = True、减少训练步数，或者给它更多时间：tinytf validate --timeout 300 {path}"),
    "stopped_test": ("stopped after {ran:.0f} s (the limit is {limit:g} s per cell): too slow, not wrong; see below",
                     "运行 {ran:.0f} 秒后被停止（每个单元限时 {limit:g} 秒）：是太慢，不是错误；见下文"),
    "stopped_skipped": ("not rerun: it was stopped for time above", "未重新运行：它在上面已因超时被停止"),
    "diagnosis_stopped": ("the diagnosis was stopped after {ran:.0f} s (its limit is {limit:g} s), so it says nothing about "
                          "your functions; give it longer: tinytf validate --timeout 300 {path}",
                          "诊断运行了 {ran:.0f} 秒后被停止（限时 {limit:g} 秒），因此没有对你的函数下任何结论；"
                          "请给它更多时间：tinytf validate --timeout 300 {path}"),
    "sc_interrupted": ("{ex} self-check was interrupted after {ran:.0f} s, before it finished (it reruns every visible "
                       "test, and a training test takes as long as its cell): set fast = True or use fewer steps, then run it again",
                       "{ex} 自检运行了 {ran:.0f} 秒后被中断，没有做完（它会重新运行所有可见测试，训练类的测试和它的单元一样慢）："
                       "请设 fast = True 或减少步数，然后重新运行"),
    # self_check
    "sc_title": ("{ex} self-check (the same check as tinytf validate, in this kernel):",
                 "{ex} 自检（与 tinytf validate 相同的检查，在当前内核中运行）："),
    "no_saved": ("the saved notebook {ex}_….ipynb was not found in this folder: its test cells were not compared with the "
                 "release (save it, or run tinytf validate on the file)",
                 "在当前文件夹中没有找到已保存的 {ex}_….ipynb，测试单元未与发布版本比对（请先保存，或对该文件运行 tinytf validate）"),
    "sc_error": ("{ex} self-check could not run ({error}).", "{ex} 自检无法运行（{error}）。"),
    "sc_clean": ("{ex} self-check: no known pitfall detected in your functions.", "{ex} 自检：没有在你的函数中发现已知陷阱。"),
    "sc_found": ("{ex} self-check: {n} problem{s} found:", "{ex} 自检：发现 {n} 个问题："),
    "sc_full": ("For the full check (runs the notebook and every visible test): tinytf validate {where}",
                "完整检查（运行整个笔记本和所有可见测试）：tinytf validate {where}"),
    # feedback pages
    "fb_title": ("tinytf grading: {ex} for {student}", "tinytf 评分：{student} 的 {ex}"),
    "fb_points": ("**{total:g} / {best:g} points** (written answers are added by an instructor).",
                  "**{total:g} / {best:g} 分**（书面回答由教师另行评分）。"),
    "fb_note": ("Note: {note}", "说明：{note}"),
    "fb_columns": ("| test cell | points | status | details |", "| 测试单元 | 得分 | 状态 | 说明 |"),
}

STATUS_NAMES: dict[str, str] = {
    "ok": "通过", "failed": "错误", "error": "出错", "timeout": "超时", "missing-cell": "缺少单元", "tampered": "被篡改",
    "unreadable": "无法读取", "missing-submission": "未提交", "needs-manual-grade": "待人工评分",
}

# the grader's English phrases (finish.py, grade.py) and their Chinese; longest first when applied
_PHRASES: tuple[tuple[str, str], ...] = (
    ("this test cell is missing from the submission (deleted, renamed, or metadata stripped)",
     "提交的笔记本里没有这个测试单元（被删除、改名，或元数据被删掉）"),
    ("this test cell is missing from the graded notebook", "评分后的笔记本里没有这个测试单元"),
    ("written answer: an instructor grades it", "书面回答：由教师评分"),
    ("this test comes from an earlier release of ", "这个测试来自早期发布的 "),
    ("; today's version was run", "；运行的是今天的版本"),
    ("this locked test cell was edited; edited test cells earn 0", "这个锁定的测试单元被修改了；被修改的测试单元记 0 分"),
    ("the cell passed but exported no result for the independent check", "这个单元通过了，但没有把结果交给独立检查"),
    ("wrong result (found by the independent check): ", "结果错误（独立检查发现）："),
    ("had been replaced; the independent check: ", "已被替换；独立检查："),
    ("the cell passed only because ", "这个单元之所以通过，只是因为 "),
    ("the cell ran past the per-cell time limit", "这个单元超过了每个单元的时间限制"),
    (" and was stopped: too slow, not wrong. Set fast = True in the parameters cell or use fewer steps",
     "，已被停止：是太慢，不是错误。请在 parameters 单元里设 fast = True 或减少步数"),
    ("ran past the per-cell time limit", "超过了每个单元的时间限制"),
    (" it had run ", "已运行 "),
    ("the notebook's kernel died (os._exit, a crash, or the memory limit) and grading stopped",
     "笔记本的内核退出了（os._exit、崩溃或超出内存限制），评分中止"),
    ("the notebook ran past the whole-notebook limit", "笔记本超过了整本的时间限制"),
    ("and was stopped", "，已被停止"),
    ("nbgrader could not grade this notebook: ", "nbgrader 无法为这个笔记本评分："),
    ("the submission has no nbgrader cell metadata (stripped?)", "提交的笔记本没有 nbgrader 单元元数据（被删掉了？）"),
    ("not implemented yet", "尚未实现"),
    ("a hidden test", "一个隐藏测试"),
)


def say(key: str, lang: str = "en", **values: object) -> str:
    """Message ``key`` in ``lang`` (``"zh"`` or English), formatted with ``values``."""
    en, zh = MESSAGES[key]
    return (zh if lang == "zh" else en).format(**values)


def status_name(status: str, lang: str = "en") -> str:
    """A gradebook status for a student page: the code itself in English, its Chinese name in Chinese."""
    return f"{STATUS_NAMES.get(status, status)}（{status}）" if lang == "zh" else status


def translate(message: str, lang: str = "en") -> str:
    """A grader message in ``lang``: for Chinese its known English phrases become Chinese; the rest
    (a test's own assertion text, shapes and numbers) is kept as it is."""
    if lang != "zh" or not message:
        return message
    for en, zh in _PHRASES:
        message = message.replace(en, zh)
    message = re.sub(r"\bcell (\d+) \(defines ([^)]*)\)", r"第 \1 个单元（定义 \2）", message)
    message = re.sub(r"\bcell (\d+)\b", r"第 \1 个单元", message)
    message = re.sub(r" of ([\d.]+) s\b", r"（\1 秒）", message)
    return re.sub(r"\(([\d.]+) s\)", r"（\1 秒）", message)
