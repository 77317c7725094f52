"""Prompts for the speculative-decoding benchmark: input-grounded ones (a passage, then a task whose answer copies
from it) and open-ended ones (nothing to copy).

Prompt lookup (n-gram speculation) pays off where the output repeats the input: rewriting, summarising, answering
from a passage. The passages are this project's own prose (written for it; no dataset to fetch), the tasks the three
kinds the literature measures prompt lookup on. Answering asks each passage's own question (``QUESTIONS``), as a
retrieval-augmented request does; until 2026-12-07 it asked every passage "What does the passage say, point by
point?", a second summary, which SmolLM2 answered with remarks about the passage instead of its facts. The open
prompts ask for new text with no passage: lookups there hit only where the output repeats itself, the workload on
which speculation must turn itself down (issue 35: within 3% of plain decoding).
"""

from __future__ import annotations

PASSAGES = (
    "The lighthouse at the end of the northern pier was built in 1872 from granite quarried on the island itself. "
    "Its lamp was first fuelled by whale oil, then by paraffin, and from 1931 by electricity brought across the bay "
    "on an undersea cable. The last keeper, Margaret Hale, left in 1989 when the light was automated; she had kept "
    "it for twenty-six years and logged every ship that passed, more than forty thousand entries in all. The logs "
    "are now kept in the harbour museum, which opens every day except Monday from ten in the morning until five.",
    "To repot a fig tree, water it well the day before so that the root ball holds together. Choose a pot only "
    "five centimetres wider than the old one, because a much larger pot keeps the soil wet for too long and the "
    "roots rot. Put a layer of coarse gravel at the bottom, then fresh compost mixed with one part sand to three "
    "parts compost. Lift the tree out, loosen the outer roots with your fingers, set it at the same depth as "
    "before, fill around it and press the compost down firmly. Keep it out of direct sun for a week.",
    "The committee met on Thursday to review the bridge repairs. The engineer reported that two of the six "
    "bearings had corroded and must be replaced before winter, at a cost of about eighty thousand pounds. The "
    "treasurer said the maintenance fund holds sixty thousand pounds, so the rest must come from next year's "
    "budget or a loan. The committee agreed to replace the two bearings in October, to close the bridge to heavy "
    "vehicles until then, and to ask the council for a loan of twenty thousand pounds at the meeting on the ninth.",
    "A sourdough starter is a mixture of flour and water in which wild yeasts and lactic acid bacteria live "
    "together. The bacteria make the acids that give the bread its sour taste, and the yeasts make the gas that "
    "raises the dough. A starter kept at room temperature must be fed every day with equal weights of flour and "
    "water; one kept in the refrigerator can wait a week between feeds. Before baking, take it out, feed it twice "
    "at twelve-hour intervals, and use it when it has doubled in size and smells pleasantly sour.",
    "The city library will move to the old railway goods shed on Station Road in the spring. The new building has "
    "twice the floor space of the present one, a children's room with its own entrance, a study hall with sixty "
    "desks and a cafe. Opening hours will be extended until eight in the evening on weekdays. During the move, from "
    "the third to the twenty-fourth of March, books can be returned at the town hall, and the mobile library will "
    "visit the villages on its usual days.",
    "Frost protection for an orchard begins with knowing where cold air collects. Cold air is heavier than warm "
    "air and flows downhill like water, pooling in hollows and against hedges at the foot of a slope. Trees "
    "planted in those places flower at the same time as the others but lose their blossom to frost far more "
    "often. Leaving a gap at the bottom of the hedge lets the cold air drain away; covering young trees with "
    "fleece on clear, still nights, when frost is most likely, protects the open flowers.",
)

QUESTIONS = (  # one per passage, in order: what a reader of that passage would ask of it
    "When and from what was the lighthouse built, how was its lamp fuelled over the years, who was its last keeper, "
    "and where are her logs kept?",
    "How should the tree be prepared, what pot, gravel and compost should be used, and how is the tree set in its new "
    "pot?",
    "What did the engineer report, how much money does the fund hold, and what did the committee agree to do?",
    "What lives in a starter, what does each part do, how often must it be fed, and how is it made ready before "
    "baking?",
    "Where will the library move, what will the new building have, and how can books be returned during the move?",
    "Where does cold air collect in an orchard, what happens to trees planted there, and how can they be protected?",
)

TASKS = (
    "Rewrite the following passage in plain, clear English, keeping every fact:\n\n{passage}\n\nRewritten passage:",
    "Summarise the following passage, quoting its key sentences:\n\n{passage}\n\nSummary:",
    "Read the passage and answer the question using its own words.\n\n{passage}\n\nQuestion: {question}\nAnswer:",
)


def grounded_texts(count: int) -> list[str]:
    """``count`` prompts, every passage with every task in turn (cycled; the rewrites first)."""
    texts = [t.format(passage=p, question=q) for t in TASKS for p, q in zip(PASSAGES, QUESTIONS)]
    return [texts[i % len(texts)] for i in range(count)]


OPEN_PROMPTS = (
    "Write a short poem about rain on a tin roof at night.",
    "Explain to a ten-year-old why the sky is blue and sunsets are red.",
    "Give five pieces of advice for someone starting their first job, with a reason for each.",
    "Describe a walk through a market town on a cold winter morning.",
    "What are the advantages and disadvantages of working from home?",
    "Invent a recipe for a vegetable soup and explain each step.",
)


def open_texts(count: int) -> list[str]:
    """``count`` open-ended prompts (cycled)."""
    return [OPEN_PROMPTS[i % len(OPEN_PROMPTS)] for i in range(count)]
