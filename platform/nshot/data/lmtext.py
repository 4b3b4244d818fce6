"""Offline text for the LLM methods: facts, general text, and the tiny LM's capabilities.

* :func:`real_facts`: a hand-written candidate list of real-world facts (country -> capital,
  language, currency, continent; book -> author; element -> symbol) with four templates each, for pretrained models. Methods keep the facts a
  model answers correctly before any edit.
* :func:`synthetic_facts`: a generated fact world (pronounceable made-up names, five relations,
  four templates each plus a French rendering) that the tiny LMs are trained on.
* :func:`general_text`: paragraphs of Python standard-library docstrings, split 90/10 by module
  (``"train"`` / ``"heldout"``) for key statistics and perplexity.
* :func:`tiny_capabilities` / :func:`tiny_sft_task`: the four capabilities of the tiny LM (facts,
  math, code, multilingual) as ``(prompt, answer)`` pairs, and a new task for fine-tuning.

Everything is generated or read from the installed Python: nothing is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass

from nshot.data.sources import STDLIB_DOC_MODULES, _module_docs

__all__ = [
    "REAL_RELATIONS",
    "Fact",
    "general_text",
    "real_facts",
    "synthetic_facts",
    "tiny_capabilities",
    "tiny_corpus",
    "tiny_sft_task",
]


@dataclass(frozen=True)
class Fact:
    """One fact with prompt templates; the answer follows a prompt after one space."""

    relation: str
    subject: str
    answer: str
    templates: tuple[str, ...]  # "{}" marks the subject; [0] rewrite prompt, [1:] paraphrases

    def prompt(self, i: int = 0) -> str:
        return self.templates[i].format(self.subject)

    @property
    def n_prompts(self) -> int:
        return len(self.templates)


# --------------------------------------------------------------------------------------------
# real-world facts (candidates; filter by what the model knows)

_CAPITALS = """
Afghanistan:Kabul Albania:Tirana Algeria:Algiers Angola:Luanda Argentina:Buenos Aires
Armenia:Yerevan Australia:Canberra Austria:Vienna Azerbaijan:Baku Bahrain:Manama
Bangladesh:Dhaka Belarus:Minsk Belgium:Brussels Bolivia:Sucre Bosnia:Sarajevo
Botswana:Gaborone Brazil:Brasília Bulgaria:Sofia Burundi:Gitega Cambodia:Phnom Penh
Cameroon:Yaoundé Canada:Ottawa Chad:N'Djamena Chile:Santiago China:Beijing Colombia:Bogotá
Croatia:Zagreb Cuba:Havana Cyprus:Nicosia Denmark:Copenhagen Djibouti:Djibouti Ecuador:Quito
Egypt:Cairo Eritrea:Asmara Estonia:Tallinn Ethiopia:Addis Ababa Fiji:Suva Finland:Helsinki
France:Paris Gabon:Libreville Georgia:Tbilisi Germany:Berlin Ghana:Accra Greece:Athens
Guatemala:Guatemala City Guinea:Conakry Haiti:Port-au-Prince Honduras:Tegucigalpa
Hungary:Budapest Iceland:Reykjavik India:New Delhi Indonesia:Jakarta Iran:Tehran Iraq:Baghdad
Ireland:Dublin Israel:Jerusalem Italy:Rome Jamaica:Kingston Japan:Tokyo Jordan:Amman
Kazakhstan:Astana Kenya:Nairobi Kuwait:Kuwait City Kyrgyzstan:Bishkek Laos:Vientiane
Latvia:Riga Lebanon:Beirut Liberia:Monrovia Libya:Tripoli Lithuania:Vilnius
Luxembourg:Luxembourg Madagascar:Antananarivo Malawi:Lilongwe Malaysia:Kuala Lumpur Mali:Bamako
Malta:Valletta Mauritania:Nouakchott Mexico:Mexico City Moldova:Chisinau Monaco:Monaco
Mongolia:Ulaanbaatar Montenegro:Podgorica Morocco:Rabat Mozambique:Maputo Myanmar:Naypyidaw
Namibia:Windhoek Nepal:Kathmandu Netherlands:Amsterdam Nicaragua:Managua Niger:Niamey
Nigeria:Abuja Norway:Oslo Oman:Muscat Pakistan:Islamabad Panama:Panama City Paraguay:Asunción
Peru:Lima Philippines:Manila Poland:Warsaw Portugal:Lisbon Qatar:Doha Romania:Bucharest
Russia:Moscow Rwanda:Kigali Senegal:Dakar Serbia:Belgrade Singapore:Singapore Slovakia:Bratislava
Slovenia:Ljubljana Somalia:Mogadishu Spain:Madrid Sudan:Khartoum Sweden:Stockholm
Switzerland:Bern Syria:Damascus Taiwan:Taipei Tajikistan:Dushanbe Tanzania:Dodoma Thailand:Bangkok
Togo:Lomé Tunisia:Tunis Turkey:Ankara Turkmenistan:Ashgabat Uganda:Kampala Ukraine:Kyiv
England:London Scotland:Edinburgh Wales:Cardiff Uruguay:Montevideo Uzbekistan:Tashkent
Venezuela:Caracas Vietnam:Hanoi Yemen:Sanaa Zambia:Lusaka Zimbabwe:Harare
South Korea:Seoul North Korea:Pyongyang Saudi Arabia:Riyadh New Zealand:Wellington
South Africa:Pretoria Sri Lanka:Colombo Costa Rica:San José El Salvador:San Salvador
Dominican Republic:Santo Domingo Czech Republic:Prague United Arab Emirates:Abu Dhabi
Ivory Coast:Yamoussoukro Papua New Guinea:Port Moresby Trinidad and Tobago:Port of Spain
"""

_LANGUAGES = """
France:French Germany:German Italy:Italian Spain:Spanish Portugal:Portuguese Brazil:Portuguese
Mexico:Spanish Argentina:Spanish Japan:Japanese China:Chinese Russia:Russian Greece:Greek
Turkey:Turkish Poland:Polish Netherlands:Dutch Sweden:Swedish Norway:Norwegian Denmark:Danish
Finland:Finnish Hungary:Hungarian Iran:Persian Egypt:Arabic Israel:Hebrew Thailand:Thai
Vietnam:Vietnamese South Korea:Korean Ukraine:Ukrainian Romania:Romanian Indonesia:Indonesian
Austria:German Chile:Spanish Peru:Spanish Colombia:Spanish Iceland:Icelandic
"""

# (subject, answer) pairs of the further relations besides capitals and languages (currency,
# continent, authors, element symbols)
_CURRENCIES = (
    ("Japan", "yen"), ("China", "yuan"), ("India", "rupee"), ("Russia", "ruble"),
    ("Mexico", "peso"), ("Brazil", "real"), ("South Africa", "rand"), ("South Korea", "won"),
    ("Thailand", "baht"), ("Vietnam", "dong"), ("Poland", "zloty"), ("Turkey", "lira"),
    ("Sweden", "krona"), ("Norway", "krone"), ("Denmark", "krone"), ("Switzerland", "franc"),
    ("United Kingdom", "pound"), ("United States", "dollar"), ("Canada", "dollar"),
    ("Australia", "dollar"), ("Germany", "euro"), ("France", "euro"), ("Italy", "euro"),
    ("Spain", "euro"), ("Israel", "shekel"), ("Egypt", "pound"), ("Nigeria", "naira"),
    ("Kenya", "shilling"), ("Argentina", "peso"), ("Chile", "peso"), ("Colombia", "peso"),
    ("Peru", "sol"), ("Indonesia", "rupiah"), ("Malaysia", "ringgit"), ("Philippines", "peso"),
    ("Pakistan", "rupee"), ("Iran", "rial"), ("Saudi Arabia", "riyal"), ("Ukraine", "hryvnia"),
    ("Hungary", "forint"), ("Czech Republic", "koruna"), ("Bangladesh", "taka"),
    ("Ghana", "cedi"), ("Greece", "euro"),
)  # fmt: skip
_CONTINENTS = {
    "Europe": "France Germany Italy Spain Portugal Poland Sweden Norway Finland Denmark Greece "
    "Austria Hungary Romania Belgium Netherlands Ireland Switzerland Ukraine Bulgaria Serbia "
    "Croatia",
    "Asia": "Japan China India Thailand Vietnam Indonesia Malaysia Pakistan Bangladesh Nepal "
    "Mongolia Cambodia Laos Iran Iraq Afghanistan Kazakhstan",
    "Africa": "Egypt Nigeria Kenya Ethiopia Ghana Morocco Algeria Tunisia Senegal Uganda Tanzania "
    "Zambia Zimbabwe Angola Mozambique Madagascar Cameroon Mali Niger Sudan",
    "South America": "Brazil Argentina Chile Peru Colombia Venezuela Ecuador Bolivia Paraguay "
    "Uruguay",
}
_AUTHORS = (
    ("Hamlet", "William Shakespeare"), ("Macbeth", "William Shakespeare"),
    ("Romeo and Juliet", "William Shakespeare"), ("Pride and Prejudice", "Jane Austen"),
    ("Emma", "Jane Austen"), ("War and Peace", "Leo Tolstoy"), ("Anna Karenina", "Leo Tolstoy"),
    ("Crime and Punishment", "Fyodor Dostoevsky"),
    ("The Brothers Karamazov", "Fyodor Dostoevsky"), ("Don Quixote", "Miguel de Cervantes"),
    ("Nineteen Eighty-Four", "George Orwell"), ("Animal Farm", "George Orwell"),
    ("The Great Gatsby", "F. Scott Fitzgerald"), ("Moby-Dick", "Herman Melville"),
    ("Oliver Twist", "Charles Dickens"), ("Great Expectations", "Charles Dickens"),
    ("A Tale of Two Cities", "Charles Dickens"), ("Les Misérables", "Victor Hugo"),
    ("The Odyssey", "Homer"), ("The Iliad", "Homer"), ("Frankenstein", "Mary Shelley"),
    ("Dracula", "Bram Stoker"), ("Ulysses", "James Joyce"),
    ("The Divine Comedy", "Dante Alighieri"), ("Faust", "Johann Wolfgang von Goethe"),
    ("The Old Man and the Sea", "Ernest Hemingway"), ("Jane Eyre", "Charlotte Brontë"),
    ("Wuthering Heights", "Emily Brontë"), ("The Adventures of Tom Sawyer", "Mark Twain"),
    ("Adventures of Huckleberry Finn", "Mark Twain"), ("The Origin of Species", "Charles Darwin"),
    ("The Hobbit", "J. R. R. Tolkien"), ("The Lord of the Rings", "J. R. R. Tolkien"),
    ("To Kill a Mockingbird", "Harper Lee"),
    ("One Hundred Years of Solitude", "Gabriel García Márquez"),
)  # fmt: skip
_ELEMENTS = (
    ("gold", "Au"), ("silver", "Ag"), ("iron", "Fe"), ("copper", "Cu"), ("lead", "Pb"),
    ("sodium", "Na"), ("potassium", "K"), ("oxygen", "O"), ("hydrogen", "H"), ("carbon", "C"),
    ("nitrogen", "N"), ("helium", "He"), ("neon", "Ne"), ("calcium", "Ca"), ("magnesium", "Mg"),
    ("zinc", "Zn"), ("tin", "Sn"), ("mercury", "Hg"), ("sulfur", "S"), ("chlorine", "Cl"),
    ("uranium", "U"), ("platinum", "Pt"), ("aluminium", "Al"), ("silicon", "Si"),
    ("phosphorus", "P"), ("fluorine", "F"), ("lithium", "Li"), ("tungsten", "W"),
)  # fmt: skip

_REAL_TEMPLATES = {
    "capital": (
        "The capital of {} is",
        "The capital city of {} is",
        "{}'s capital is",
        "The city that serves as the capital of {} is",
    ),
    "language": (
        "The official language of {} is",
        "The main language spoken in {} is",
        "People in {} mostly speak",
        "The national language of {} is",
    ),
    "currency": (
        "The official currency of {} is the",
        "The currency of {} is the",
        "{}'s currency is the",
        "In {}, people pay with the",
    ),
    "continent": (
        "{} is located in the continent of",
        "{} is part of the continent of",
        "{} is a country in",
        "The continent where {} lies is",
    ),
    "author": (
        "The book {} was written by",
        "{} was written by",
        "The author of {} is",
        "{} is a work by",
    ),
    "element": (
        "The chemical symbol for {} is",
        "In chemistry, {} has the symbol",
        "The periodic table symbol for {} is",
        "The symbol of the element {} is",
    ),
}
REAL_RELATIONS = tuple(_REAL_TEMPLATES)


def _pairs(block: str) -> list[tuple[str, str]]:
    """Parse ``"Subject:Answer Subject:Answer ..."`` where both may hold several words."""
    parts = " ".join(block.split()).split(":")
    out = []
    subject = parts[0]
    for i, chunk in enumerate(parts[1:], start=1):
        if i == len(parts) - 1:
            out.append((subject, chunk))
            break
        # chunk = "<answer words> <next subject words>"
        words = chunk.split(" ")
        k = _subject_split(words)
        out.append((subject, " ".join(words[:k])))
        subject = " ".join(words[k:])
    return out


_MULTIWORD_SUBJECTS = {
    "South Korea",
    "North Korea",
    "Saudi Arabia",
    "New Zealand",
    "South Africa",
    "Sri Lanka",
    "Costa Rica",
    "El Salvador",
    "Dominican Republic",
    "Czech Republic",
    "United Arab Emirates",
    "Ivory Coast",
    "Papua New Guinea",
    "Trinidad and Tobago",
}


def _subject_split(words: list[str]) -> int:
    for k in range(1, len(words)):
        if " ".join(words[k:]) in _MULTIWORD_SUBJECTS:
            return k
    return len(words) - 1


@functools.cache
def real_facts() -> list[Fact]:
    """Candidate real-world facts for pretrained LMs: 149 capitals, 34 official languages, 44
    currencies, 69 continents, 35 book authors and 28 element symbols (:data:`REAL_RELATIONS`).

    Templates: ``_REAL_TEMPLATES``; template 0 is the rewrite prompt. Not every model knows every
    fact: filter with the model before use.
    """
    pairs = {
        "capital": _pairs(_CAPITALS),
        "language": _pairs(_LANGUAGES),
        "currency": list(_CURRENCIES),
        "continent": [(c, k) for k, cs in _CONTINENTS.items() for c in cs.split()],
        "author": list(_AUTHORS),
        "element": list(_ELEMENTS),
    }
    return [
        Fact(relation, subject, answer, _REAL_TEMPLATES[relation])
        for relation in REAL_RELATIONS
        for subject, answer in pairs[relation]
    ]


# --------------------------------------------------------------------------------------------
# synthetic fact world (the tiny LMs)

_SYLLABLES = (
    "ka lo mi ra tu zen bor vi sha nel dor pa qui fe gan lu ro ti ma so "
    "va ke ni ba to ru del mon sar fi"
).split()

_OBJECTS = {
    "occupation": "baker farmer doctor pilot teacher painter sailor miner judge tailor".split(),
    "colour": "red blue green yellow purple orange black white grey brown".split(),
    "sport": "tennis football hockey cricket rugby golf chess boxing rowing skiing".split(),
}

_SYN_TEMPLATES = {
    "capital": (
        "the capital of {} is",
        "{} has its capital in",
        "the capital city of {} is",
        "people in {} call their capital",
    ),
    "occupation": (
        "{} works as a",
        "the job of {} is",
        "by trade {} is a",
        "{} earns a living as a",
    ),
    "colour": (
        "the favourite colour of {} is",
        "{} likes the colour",
        "the colour {} prefers is",
        "{} always wears",
    ),
    "birthplace": (
        "{} was born in",
        "the birthplace of {} is",
        "{} comes from the city of",
        "{} grew up in",
    ),
    "sport": (
        "{} plays",
        "the sport of {} is",
        "{} is very good at",
        "every weekend {} plays",
    ),
}

_FRENCH = {
    "capital": "la capitale de {} est",
    "occupation": "{} travaille comme",
    "colour": "la couleur préférée de {} est",
    "birthplace": "{} est né à",
    "sport": "{} joue au",
}


def _names(n: int, rng: random.Random, taken: set[str]) -> list[str]:
    out = []
    while len(out) < n:
        k = rng.choice((2, 3))
        name = "".join(rng.choice(_SYLLABLES) for _ in range(k)).capitalize()
        if name not in taken:
            taken.add(name)
            out.append(name)
    return out


@functools.cache
def synthetic_facts(n: int = 500, seed: int = 0) -> list[Fact]:
    """``n`` generated facts over five relations (capital, occupation, colour, birthplace, sport).

    Subjects are unique made-up names; capitals and birthplaces are made-up city names (30 of
    them); the other objects come from ten-word lists. Each fact has four English templates
    (``templates[0]`` is the rewrite prompt) and one French rendering (:func:`french_prompt`).
    """
    rng = random.Random(f"nshot-facts-{seed}")
    taken: set[str] = set()
    cities = _names(30, rng, taken)
    subjects = _names(n, rng, taken)
    relations = list(_SYN_TEMPLATES)
    facts = []
    for i, subject in enumerate(subjects):
        relation = relations[i % len(relations)]
        pool = cities if relation in ("capital", "birthplace") else _OBJECTS[relation]
        facts.append(Fact(relation, subject, rng.choice(pool), _SYN_TEMPLATES[relation]))
    return facts


def french_prompt(fact: Fact) -> str:
    """The French rendering of a synthetic fact's prompt (the multilingual capability)."""
    return _FRENCH[fact.relation].format(fact.subject)


# --------------------------------------------------------------------------------------------
# general text


@functools.cache
def _doc_paragraphs() -> dict[str, list[str]]:
    return {m: sorted(_module_docs(m)) for m in STDLIB_DOC_MODULES}


def _is_heldout(module: str) -> bool:
    return int(hashlib.sha256(module.encode()).hexdigest(), 16) % 10 == 0


@functools.cache
def general_text(split: str) -> list[str]:
    """Docstring paragraphs of the standard library; ``split`` is ``"train"`` or ``"heldout"``.

    Modules are assigned by the sha256 of their name (about 10% held out); a paragraph found in
    both splits is kept only in ``train``. The texts follow the running Python version.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    per = _doc_paragraphs()
    train = sorted({t for m, ts in per.items() if not _is_heldout(m) for t in ts})
    if split == "train":
        return train
    seen = set(train)
    return sorted({t for m, ts in per.items() if _is_heldout(m) for t in ts} - seen)


# --------------------------------------------------------------------------------------------
# tiny LM capabilities

_TINY_FACTS = 200


def _digits(n: int) -> str:
    return str(n)


def tiny_capabilities(split: str = "eval") -> dict[str, list[tuple[str, str]]]:
    """The tiny LM's four capabilities as ``(prompt, answer)`` pairs.

    * ``facts``: the rewrite prompts of the first 200 synthetic facts (memorised knowledge);
    * ``math``: ``a + b =`` and ``a * b =`` with single-digit operands;
    * ``code``: ``max ( a , b ) =``, ``min ( a , b ) =``, ``abs ( - a ) =``,
      ``len ( [ ... ] ) =`` with single digits;
    * ``multilingual``: the same facts through their French prompts.

    ``split="train"`` gives every item (the pretraining corpus states them all); ``"eval"`` gives
    the same items: the capabilities are knowledge and skills the model holds, and masking or
    fine-tuning is judged by how much of them survives.
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    facts = synthetic_facts()[:_TINY_FACTS]
    math = [(f"{a} + {b} =", _digits(a + b)) for a in range(10) for b in range(10)]
    math += [(f"{a} * {b} =", _digits(a * b)) for a in range(10) for b in range(10)]
    code = [(f"max ( {a} , {b} ) =", str(max(a, b))) for a in range(10) for b in range(10)]
    code += [(f"min ( {a} , {b} ) =", str(min(a, b))) for a in range(10) for b in range(10)]
    code += [(f"abs ( - {a} ) =", str(a)) for a in range(10)]
    rng = random.Random("nshot-len")
    for n in range(1, 8):
        for _ in range(3):
            items = " , ".join(str(rng.randrange(10)) for _ in range(n))
            code.append((f"len ( [ {items} ] ) =", str(n)))
    code = list(dict.fromkeys(code))
    return {
        "facts": [(f.prompt(0), f.answer) for f in facts],
        "math": math,
        "code": code,
        "multilingual": [(french_prompt(f), f.answer) for f in facts],
    }


def tiny_sft_task(split: str) -> list[tuple[str, str]]:
    """A new surface format for addition, ``add ( a , b ) ->`` -> ``a+b``, absent from pretraining.

    Operands 0..19; 300 training pairs and the other 100 held out (by a fixed shuffle).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', not {split!r}")
    pairs = [(f"add ( {a} , {b} ) ->", _digits(a + b)) for a in range(20) for b in range(20)]
    random.Random("nshot-add").shuffle(pairs)
    return pairs[:300] if split == "train" else pairs[300:]


def tiny_corpus(seed: int = 0) -> list[str]:
    """The tiny LMs' pretraining documents: every fact in all its templates (English and French),
    the math and code items, and the training docstrings. Shuffled by ``seed``."""
    docs = []
    for f in synthetic_facts():
        for i in range(f.n_prompts):
            docs.append(f"{f.prompt(i)} {f.answer} .")
        docs.append(f"{french_prompt(f)} {f.answer} .")
    caps = tiny_capabilities("train")
    for name in ("math", "code"):
        docs.extend(f"{p} {a}" for p, a in caps[name])
    docs.extend(general_text("train"))
    random.Random(f"nshot-corpus-{seed}").shuffle(docs)
    return docs
