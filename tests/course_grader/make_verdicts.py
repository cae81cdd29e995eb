"""Writes verdicts.json: the course's own grader (drgrpo_grader.py of CS336 assignment 5) run on the
inputs below, so that tests/test_grader.py can compare grader.py with it without the course's code
in this repository.

The course grader imports sympy, math-verify, latex2sympy2_extended and pylatexenc; it is run in a
scratch venv outside the repository, from a file given by path (never copied here):

  git -C COURSE_REPO show HEAD:cs336_alignment/drgrpo_grader.py > /tmp/course/drgrpo_grader.py
  python3 -m venv /tmp/coursevenv
  /tmp/coursevenv/bin/pip install "math-verify[antlr4_13_2]>=0.7.0" "pylatexenc==2.10"
  /tmp/coursevenv/bin/python tests/course_grader/make_verdicts.py /tmp/course/drgrpo_grader.py \\
      --commit "$(git -C COURSE_REPO rev-parse HEAD)" > tests/course_grader/verdicts.json

Recorded per reward case: the verdict of the course's reward function and the text it handed to its
`grade` (None when it graded nothing), caught by wrapping that `grade`. Per equivalence case: the
course's `grade(answer, gold)` with its default fast=True, as its reward functions call it.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import platform

# (rule, response, ground truth): how the course finds the answer it grades
R1 = "Let me think. </think> <answer> {} </answer>"
REWARD_CASES = [
    # question_only: the last \boxed{...}, nothing else
    ("question_only", "so 2+2 is \\boxed{4}.", "4"),
    ("question_only", "\\boxed{3} no wait \\boxed{4}", "4"),
    ("question_only", "\\boxed{4} no wait \\boxed{3}", "4"),
    ("question_only", "The answer is 4.", "4"),
    ("question_only", "The answer is \\boxed{4}.", "4"),
    ("question_only", "Therefore, the final answer is: $4$. I hope it is correct.", "4"),
    (
        "question_only",
        "Therefore, the final answer is: $\\boxed{\\frac{3}{4}}$. I hope it is correct.",
        "\\frac{3}{4}",
    ),
    ("question_only", "\\fbox{4}", "4"),
    ("question_only", "\\boxed{4} and \\fbox{5}", "4"),
    ("question_only", "\\fbox{5} and \\boxed{4}", "4"),
    ("question_only", "\\boxed 4", "4"),
    ("question_only", "\\boxed {4}", "4"),
    ("question_only", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("question_only", "\\boxed{\\frac{1}{2}", "\\frac{1}{2}"),
    ("question_only", "\\boxed{4} then \\boxed{", "4"),
    ("question_only", "\\boxed{4} then \\boxed 5", "4"),
    ("question_only", "\\boxed{\\boxed{4}}", "4"),
    ("question_only", "$\\boxed{ 4 }$\n\n", "4"),
    ("question_only", "\\boxed{}", "4"),
    ("question_only", "\\boxed{5}", "4"),
    ("question_only", "<answer> 4 </answer>", "4"),
    ("question_only", "</think> <answer> \\boxed{4} </answer>", "4"),
    ("question_only", "\\boxed{4}", ["3", "4"]),
    ("question_only", "\\boxed{4}", 4),
    ("question_only", "\\boxed{4}", "The sum is $\\boxed{4}$."),
    ("question_only", "#### 4", "4"),
    ("question_only", "", "4"),
    # r1_zero: '</think> <answer>' and '</answer>' anywhere; the text after the last '<answer>'
    # with every '</answer>' removed; a \boxed{...} in it unwrapped
    ("r1_zero", R1.format("18"), "18"),
    ("r1_zero", R1.format("17"), "18"),
    ("r1_zero", "<think> 9 * 2 </think> <answer>18</answer>", "18"),
    ("r1_zero", "</think><answer> 18 </answer>", "18"),
    ("r1_zero", "</think>  <answer> 18 </answer>", "18"),
    ("r1_zero", "</think>\n<answer> 18 </answer>", "18"),
    ("r1_zero", "</think> <answer> 18", "18"),
    ("r1_zero", "<answer> 18 </answer>", "18"),
    ("r1_zero", "18", "18"),
    ("r1_zero", "The answer is 18.", "18"),
    ("r1_zero", R1.format("17") + " <answer> 18 </answer>", "18"),
    ("r1_zero", R1.format("18") + " <answer> 17", "18"),
    ("r1_zero", "<answer> 17 </answer> </think> <answer> 18", "18"),
    ("r1_zero", R1.format("18") + " So 18 it is.", "18"),
    ("r1_zero", R1.format("18") + "\n", "18"),
    ("r1_zero", R1.format("\\boxed{18}"), "18"),
    ("r1_zero", R1.format("\\boxed{17} or \\boxed{18}"), "18"),
    ("r1_zero", R1.format("\\boxed{18"), "18"),
    ("r1_zero", R1.format("\\boxed 18"), "18"),
    ("r1_zero", R1.format("\\boxed{\\dfrac{1}{2}}"), "0.5"),
    ("r1_zero", R1.format("\\fbox{18}"), "18"),
    ("r1_zero", R1.format("The answer is 18"), "18"),
    ("r1_zero", R1.format("\n18\n"), "18"),
    ("r1_zero", R1.format(""), "18"),
    ("r1_zero", R1.format("18"), ["17", "18"]),
    ("r1_zero", R1.format("18"), 18),
    ("r1_zero", "\\boxed{18} </think> <answer> 17 </answer>", "18"),
]

# (answer, gold): the course's equivalence, grade(), where the answer was already found
EQUIVALENCE_CASES = [
    # fractions and decimals
    ("0.5", "1/2"),
    ("1/2", "0.5"),
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{1}{2}", "\\frac12"),
    ("\\tfrac{1}{2}", "\\frac{1}{2}"),
    ("2/4", "1/2"),
    ("\\frac{2}{4}", "\\frac{1}{2}"),
    ("0.25", "\\frac{1}{4}"),
    ("1.5", "\\frac{3}{2}"),
    ("1/3", "0.33"),
    ("0.333", "\\frac{1}{3}"),
    ("3\\frac{1}{2}", "\\frac{7}{2}"),
    ("3 \\frac{1}{2}", "3.5"),
    ("-\\frac{1}{2}", "\\frac{-1}{2}"),
    # integers written otherwise
    ("18.00", "18"),
    ("18.", "18"),
    ("007", "7"),
    ("2", "2.0"),
    ("1e3", "1000"),
    ("- 5", "-5"),
    # units, degrees, money, percentages
    ("10 cm", "10"),
    ("10\\text{ cm}", "10"),
    ("18 dollars", "18"),
    ("\\$18", "18"),
    ("\\$1,000", "1000"),
    ("12 \\text{ inches}", "12"),
    ("30^\\circ", "30"),
    ("30^{\\circ}", "30"),
    ("30 degrees", "30"),
    ("50\\%", "50"),
    ("50%", "50"),
    ("50\\%", "0.5"),
    ("0.5", "50\\%"),
    ("5 \\text{ apples}", "5"),
    # thousands separators
    ("1,234", "1234"),
    ("1,234,567", "1234567"),
    ("1{,}234", "1234"),
    ("58, 500", "58500"),
    ("1,0", "10"),
    # variables and equations
    ("x = 5", "5"),
    ("k=5", "5"),
    ("y = 2x + 3", "2x+3"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}"),
    ("\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}"),
    ("5\\sqrt{2}", "\\sqrt{50}"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("\\pi/2", "\\frac{\\pi}{2}"),
    ("1+x", "x+1"),
    ("-x-1", "-(x+1)"),
    ("1,000,000", "10^6"),
    ("5.50", "5.5"),
    ("\\$5.50", "5.5"),
    ("10\\%", "0.1"),
    ("2\\pi", "6.2832"),
    ("\\pi", "3.14159"),
    # tuples, intervals, sets, matrices
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("[1, 2)", "[1,2)"),
    ("(1, 2]", "[1,2)"),
    ("(1,2)", "[1,2]"),
    ("(-\\infty, 2] \\cup (3, 5)", "(-\\infty,2]\\cup(3,5)"),
    ("[3,4] \\cup [1,2]", "[1,2] \\cup [3,4]"),
    ("x \\in [2, 5)", "[2,5)"),
    ("\\{1,2\\}", "\\{2,1\\}"),
    ("1, 2", "2, 1"),
    ("(1, 2)", "(2, 1)"),
    ("\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    # text answers
    ("\\text{(B)}", "B"),
    ("B", "(B)"),
    ("\\text{Evelyn}", "Evelyn"),
    ("evelyn", "Evelyn"),
    ("yes", "Yes"),
    ("\\text{odd}", "odd"),
    ("\\text{Monday}", "Monday"),
    ("\\textbf{odd}", "odd"),
    # what an extraction leaves behind
    ("\\fbox{18}", "18"),
    ("The answer is 18", "18"),
    (" 18  So 18 it is.", "18"),
    (" \\boxed{18} ", "18"),
    ("", "18"),
    # logic and relations
    ("\\neg 5", "5"),
    ("5 \\lor 6", "6"),
    ("10^{10^{10}}", "10"),
    ("\\infty", "\\infty"),
]


def main():
    p = argparse.ArgumentParser(description="Record the course grader's verdicts as test data.")
    p.add_argument("grader", help="path of the course's drgrpo_grader.py")
    p.add_argument("--commit", required=True, help="the course repository's commit of that file")
    args = p.parse_args()
    spec = importlib.util.spec_from_file_location("drgrpo_grader", args.grader)
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)

    graded = []  # what the reward function handed to grade()
    real_grade = course.grade

    def recording_grade(model_answer, gt_answer, fast=True):
        graded.append(model_answer)
        return real_grade(model_answer, gt_answer, fast)

    course.grade = recording_grade
    rewards = []
    for rule, response, truth in REWARD_CASES:
        graded.clear()
        verdict = getattr(course, f"{rule}_reward_fn")(response, truth)
        answer = None
        if graded:
            answer = graded[0]
        rewards.append(
            {
                "rule": rule,
                "response": response,
                "ground_truth": truth,
                "course_answer": answer,
                "course": {k: verdict[k] for k in ("reward", "format_reward", "answer_reward")},
            }
        )
    course.grade = real_grade
    equivalence = []
    for answer, gold in EQUIVALENCE_CASES:
        verdict = course.grade(answer, gold)
        equivalence.append({"answer": answer, "gold": gold, "course": bool(verdict)})
    packages = {}
    for name in ["sympy", "math-verify", "latex2sympy2_extended", "pylatexenc"]:
        packages[name] = importlib.metadata.version(name)
    header = {
        "what": "verdicts of the course's grader (CS336 assignment 5, drgrpo_grader.py) on the "
        "inputs of tests/course_grader/make_verdicts.py (generated data, none of its code)",
        "repository": "stanford-cs336/assignment5-alignment on GitHub",
        "file": "cs336_alignment/drgrpo_grader.py",
        "commit": args.commit,
        "command": "python tests/course_grader/make_verdicts.py DRGRPO_GRADER_PY --commit COMMIT "
        "> tests/course_grader/verdicts.json, in a venv with the packages below (see the script)",
        "python": platform.python_version(),
        "packages": packages,
    }
    out = {"produced_by": header, "rewards": rewards, "equivalence": equivalence}
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
