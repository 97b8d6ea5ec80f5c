"""Caption phrasebooks: how each language names shapes, colours, sizes, positions,
backgrounds and spatial relations in the synthetic world.

The words are real translations, not transliterations, so a model that has only seen
English meets new tokens when a new language arrives (the point of a language phase).
Grammar is handled just far enough to be correct: German and Spanish inflect articles
and adjectives by gender, Russian adjectives and nouns by gender and case.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from random import Random
from typing import ClassVar

# A template wraps the core phrase; the case says how its noun phrase must be inflected.
Template = tuple[str, str]
# (relation word, case of the second noun phrase) per (relation, flipped).
RelationWords = dict[tuple[str, bool], tuple[tuple[str, str], ...]]
# Attribute value -> synonymous phrases.
Phrases = dict[str, tuple[str, ...]]
# Attribute value -> (word, gender) synonyms, or (masculine, feminine) forms.
Pairs = dict[str, tuple[tuple[str, str], ...]]
# Russian declension: gender -> endings for (nominative, genitive, instrumental).
Declension = dict[str, tuple[str, str, str]]


class Phrasebook(ABC):
    """Turns a set of mentioned attributes into one caption in one language."""

    code: ClassVar[str]
    templates: ClassVar[tuple[Template, ...]]
    relations: ClassVar[RelationWords]
    positions: ClassVar[Phrases]
    backgrounds: ClassVar[Phrases]

    @abstractmethod
    def noun_phrase(
        self, rng: Random, shape: str | None, colour: str | None, size: str | None, case: str
    ) -> str:
        """One object ("a small red circle"); a missing shape becomes a generic noun."""

    def caption(self, rng: Random, mention: Mapping[str, str], flipped: bool = False) -> str:
        """Caption mentioning exactly the attributes in `mention` (synonyms drawn from rng).

        `flipped` only matters for two-object scenes: it names object b first with the
        inverse relation ("a blue square right of a red circle"), same attributes.
        """
        pattern, case = rng.choice(self.templates)
        if "relation" in mention:
            parts = [self._pair_phrase(rng, mention, case, flipped)]
        else:
            parts = [
                self.noun_phrase(
                    rng, mention.get("shape"), mention.get("colour"), mention.get("size"), case
                )
            ]
        if "position" in mention:
            parts.append(rng.choice(self.positions[mention["position"]]))
        if "background" in mention:
            parts.append(rng.choice(self.backgrounds[mention["background"]]))
        return pattern.format(" ".join(parts))

    def _pair_phrase(
        self, rng: Random, mention: Mapping[str, str], case: str, flipped: bool
    ) -> str:
        first, second = ("b", "a") if flipped else ("a", "b")
        word, second_case = rng.choice(self.relations[(mention["relation"], flipped)])
        head = self.noun_phrase(
            rng, mention.get(f"{first}.shape"), mention.get(f"{first}.colour"), None, case
        )
        tail = self.noun_phrase(
            rng, mention.get(f"{second}.shape"), mention.get(f"{second}.colour"), None, second_case
        )
        return f"{head} {word} {tail}"


class English(Phrasebook):
    code = "en"
    templates = (
        ("{}", ""),
        ("an image of {}", ""),
        ("a picture showing {}", ""),
        ("a photo of {}", ""),
        ("there is {}", ""),
    )
    shapes: ClassVar[Phrases] = {
        "circle": ("circle", "round disc", "disk"),
        "square": ("square", "square shape"),
        "triangle": ("triangle", "triangular shape"),
        "pentagon": ("pentagon", "five-sided shape"),
        "hexagon": ("hexagon", "six-sided shape"),
        "diamond": ("diamond", "rhombus"),
        "star": ("star", "star shape"),
        "cross": ("cross", "plus sign"),
        "heart": ("heart", "heart shape"),
    }
    generic = ("shape", "object", "figure")
    colours: ClassVar[Phrases] = {
        "red": ("red",),
        "green": ("green",),
        "blue": ("blue",),
        "yellow": ("yellow",),
        "purple": ("purple", "violet"),
        "orange": ("orange",),
        "white": ("white",),
        "black": ("black",),
    }
    sizes: ClassVar[Phrases] = {
        "small": ("small", "little"),
        "medium": ("medium-sized", "mid-sized"),
        "large": ("large", "big"),
    }
    positions: ClassVar[Phrases] = {
        "left": ("on the left", "at the left side"),
        "right": ("on the right", "at the right side"),
        "top": ("at the top", "near the top"),
        "bottom": ("at the bottom", "near the bottom"),
        "centre": ("in the centre", "in the middle"),
    }
    backgrounds: ClassVar[Phrases] = {
        "grey": ("on a grey background", "against a grey background"),
        "white": ("on a white background", "against a white background"),
        "black": ("on a black background", "against a black background"),
        "stripes": ("on a striped background", "on stripes"),
        "dots": ("on a dotted background", "on a polka-dot background"),
        "checks": ("on a checkered background", "on a checkerboard"),
        "gradient": ("on a gradient background", "on a shaded background"),
    }
    relations: ClassVar[RelationWords] = {
        ("left-of", False): (("left of", ""), ("to the left of", "")),
        ("left-of", True): (("right of", ""), ("to the right of", "")),
        ("above", False): (("above", ""), ("over", "")),
        ("above", True): (("below", ""), ("under", ""), ("beneath", "")),
    }

    def noun_phrase(
        self, rng: Random, shape: str | None, colour: str | None, size: str | None, case: str
    ) -> str:
        words = []
        if size:
            words.append(rng.choice(self.sizes[size]))
        if colour:
            words.append(rng.choice(self.colours[colour]))
        words.append(rng.choice(self.shapes[shape]) if shape else rng.choice(self.generic))
        article = "an" if words[0][0] in "aeiou" else "a"
        return " ".join([article, *words])


class German(Phrasebook):
    code = "de"
    templates = (
        ("{}", "nom"),
        ("ein Bild mit {}", "dat"),
        ("ein Foto mit {}", "dat"),
        ("eine Abbildung mit {}", "dat"),
        ("zu sehen ist {}", "nom"),
    )
    # (noun, gender); nouns keep their form in the singular dative.
    shapes: ClassVar[Pairs] = {
        "circle": (("Kreis", "m"), ("Scheibe", "f")),
        "square": (("Quadrat", "n"), ("Viereck", "n")),
        "triangle": (("Dreieck", "n"),),
        "pentagon": (("Fünfeck", "n"),),
        "hexagon": (("Sechseck", "n"),),
        "diamond": (("Raute", "f"),),
        "star": (("Stern", "m"),),
        "cross": (("Kreuz", "n"), ("Pluszeichen", "n")),
        "heart": (("Herz", "n"),),
    }
    generic = (("Form", "f"), ("Figur", "f"), ("Objekt", "n"))
    # Adjective stems; mixed declension after "ein" adds the endings below.
    colours: ClassVar[Phrases] = {
        "red": ("rot",),
        "green": ("grün",),
        "blue": ("blau",),
        "yellow": ("gelb",),
        "purple": ("violett",),
        "orange": ("orangefarben",),
        "white": ("weiß",),
        "black": ("schwarz",),
    }
    sizes: ClassVar[Phrases] = {"small": ("klein",), "medium": ("mittelgroß",), "large": ("groß",)}
    endings: ClassVar[dict[tuple[str, str], str]] = {
        ("m", "nom"): "er", ("n", "nom"): "es", ("f", "nom"): "e",
        ("m", "dat"): "en", ("n", "dat"): "en", ("f", "dat"): "en",
    }  # fmt: skip
    articles: ClassVar[dict[tuple[str, str], str]] = {
        ("m", "nom"): "ein", ("n", "nom"): "ein", ("f", "nom"): "eine",
        ("m", "dat"): "einem", ("n", "dat"): "einem", ("f", "dat"): "einer",
    }  # fmt: skip
    positions: ClassVar[Phrases] = {
        "left": ("links", "auf der linken Seite"),
        "right": ("rechts", "auf der rechten Seite"),
        "top": ("oben", "im oberen Teil"),
        "bottom": ("unten", "im unteren Teil"),
        "centre": ("in der Mitte", "mittig"),
    }
    backgrounds: ClassVar[Phrases] = {
        "grey": ("auf grauem Hintergrund", "vor grauem Hintergrund"),
        "white": ("auf weißem Hintergrund", "vor weißem Hintergrund"),
        "black": ("auf schwarzem Hintergrund", "vor schwarzem Hintergrund"),
        "stripes": ("auf gestreiftem Hintergrund", "vor Streifen"),
        "dots": ("auf gepunktetem Hintergrund", "vor einem Punktmuster"),
        "checks": ("auf kariertem Hintergrund", "vor einem Schachbrettmuster"),
        "gradient": ("auf einem Farbverlauf", "vor einem Farbverlauf"),
    }
    relations: ClassVar[RelationWords] = {
        ("left-of", False): (("links von", "dat"), ("links neben", "dat")),
        ("left-of", True): (("rechts von", "dat"), ("rechts neben", "dat")),
        ("above", False): (("über", "dat"), ("oberhalb von", "dat")),
        ("above", True): (("unter", "dat"), ("unterhalb von", "dat")),
    }

    def noun_phrase(
        self, rng: Random, shape: str | None, colour: str | None, size: str | None, case: str
    ) -> str:
        noun, gender = rng.choice(self.shapes[shape]) if shape else rng.choice(self.generic)
        ending = self.endings[(gender, case)]
        adjectives = [rng.choice(self.sizes[size]) + ending] if size else []
        if colour:
            adjectives.append(rng.choice(self.colours[colour]) + ending)
        return " ".join([self.articles[(gender, case)], *adjectives, noun])


class Spanish(Phrasebook):
    code = "es"
    templates = (
        ("{}", ""),
        ("una imagen de {}", ""),
        ("una foto de {}", ""),
        ("una imagen que muestra {}", ""),
        ("se ve {}", ""),
    )
    shapes: ClassVar[Pairs] = {
        "circle": (("círculo", "m"), ("disco", "m")),
        "square": (("cuadrado", "m"),),
        "triangle": (("triángulo", "m"),),
        "pentagon": (("pentágono", "m"),),
        "hexagon": (("hexágono", "m"),),
        "diamond": (("rombo", "m"),),
        "star": (("estrella", "f"),),
        "cross": (("cruz", "f"),),
        "heart": (("corazón", "m"),),
    }
    generic = (("figura", "f"), ("forma", "f"), ("objeto", "m"))
    # (masculine, feminine) forms.
    colours: ClassVar[Pairs] = {
        "red": (("rojo", "roja"),),
        "green": (("verde", "verde"),),
        "blue": (("azul", "azul"),),
        "yellow": (("amarillo", "amarilla"),),
        "purple": (("morado", "morada"), ("violeta", "violeta")),
        "orange": (("naranja", "naranja"), ("anaranjado", "anaranjada")),
        "white": (("blanco", "blanca"),),
        "black": (("negro", "negra"),),
    }
    sizes: ClassVar[Pairs] = {
        "small": (("pequeño", "pequeña"),),
        "medium": (("mediano", "mediana"),),
        "large": (("grande", "grande"),),
    }
    positions: ClassVar[Phrases] = {
        "left": ("a la izquierda", "en el lado izquierdo"),
        "right": ("a la derecha", "en el lado derecho"),
        "top": ("arriba", "en la parte superior"),
        "bottom": ("abajo", "en la parte inferior"),
        "centre": ("en el centro", "en el medio"),
    }
    backgrounds: ClassVar[Phrases] = {
        "grey": ("sobre fondo gris", "con fondo gris"),
        "white": ("sobre fondo blanco", "con fondo blanco"),
        "black": ("sobre fondo negro", "con fondo negro"),
        "stripes": ("sobre fondo de rayas", "sobre fondo rayado"),
        "dots": ("sobre fondo de puntos", "sobre fondo de lunares"),
        "checks": ("sobre fondo a cuadros", "sobre fondo cuadriculado"),
        "gradient": ("sobre fondo degradado", "sobre un degradado"),
    }
    relations: ClassVar[RelationWords] = {
        ("left-of", False): (("a la izquierda de", ""),),
        ("left-of", True): (("a la derecha de", ""),),
        ("above", False): (("encima de", ""), ("sobre", "")),
        ("above", True): (("debajo de", ""), ("bajo", "")),
    }

    def noun_phrase(
        self, rng: Random, shape: str | None, colour: str | None, size: str | None, case: str
    ) -> str:
        noun, gender = rng.choice(self.shapes[shape]) if shape else rng.choice(self.generic)
        index = 0 if gender == "m" else 1
        words = ["un" if gender == "m" else "una", noun]
        if colour:
            words.append(rng.choice(self.colours[colour])[index])
        if size:
            words.append(rng.choice(self.sizes[size])[index])
        return " ".join(words)


# Russian adjective endings by declension class, keyed by (gender, case).
_RU_HARD: Declension = {"m": ("ый", "ого", "ым"), "f": ("ая", "ой", "ой"), "n": ("ое", "ого", "ым")}
_RU_SOFT: Declension = {"m": ("ий", "его", "им"), "f": ("яя", "ей", "ей"), "n": ("ее", "его", "им")}
_RU_VELAR: Declension = {
    "m": ("ий", "ого", "им"),
    "f": ("ая", "ой", "ой"),
    "n": ("ое", "ого", "им"),
}
_RU_STRESSED: Declension = {
    "m": ("ой", "ого", "им"),
    "f": ("ая", "ой", "ой"),
    "n": ("ое", "ого", "им"),
}
_RU_CASES = ("nom", "gen", "ins")
# The preposition "с" becomes "со" before a sibilant followed by a consonant ("со звездой").
_RU_SO = re.compile(r"(^|\s)с (?=[сзшжщ][бвгджзклмнпрстфхцчшщ])")


class Russian(Phrasebook):
    code = "ru"
    templates = (
        ("{}", "nom"),
        ("на картинке {}", "nom"),
        ("на изображении {}", "nom"),
        ("на фото {}", "nom"),
        ("картинка с {}", "ins"),
        ("изображение с {}", "ins"),
    )
    # (nominative, genitive, instrumental, gender)
    shapes: ClassVar[dict[str, tuple[tuple[str, str, str, str], ...]]] = {
        "circle": (("круг", "круга", "кругом", "m"), ("диск", "диска", "диском", "m")),
        "square": (("квадрат", "квадрата", "квадратом", "m"),),
        "triangle": (("треугольник", "треугольника", "треугольником", "m"),),
        "pentagon": (("пятиугольник", "пятиугольника", "пятиугольником", "m"),),
        "hexagon": (("шестиугольник", "шестиугольника", "шестиугольником", "m"),),
        "diamond": (("ромб", "ромба", "ромбом", "m"),),
        "star": (
            ("звезда", "звезды", "звездой", "f"),
            ("звёздочка", "звёздочки", "звёздочкой", "f"),
        ),
        "cross": (("крест", "креста", "крестом", "m"), ("плюс", "плюса", "плюсом", "m")),
        "heart": (("сердце", "сердца", "сердцем", "n"), ("сердечко", "сердечка", "сердечком", "n")),
    }
    generic = (("фигура", "фигуры", "фигурой", "f"), ("предмет", "предмета", "предметом", "m"))
    # (stem, declension class)
    colours: ClassVar[dict[str, tuple[tuple[str, Declension], ...]]] = {
        "red": (("красн", _RU_HARD),),
        "green": (("зелён", _RU_HARD),),
        "blue": (("син", _RU_SOFT),),
        "yellow": (("жёлт", _RU_HARD),),
        "purple": (("фиолетов", _RU_HARD),),
        "orange": (("оранжев", _RU_HARD),),
        "white": (("бел", _RU_HARD),),
        "black": (("чёрн", _RU_HARD),),
    }
    sizes: ClassVar[dict[str, tuple[tuple[str, Declension], ...]]] = {
        "small": (("маленьк", _RU_VELAR), ("небольш", _RU_STRESSED)),
        "medium": (("средн", _RU_SOFT),),
        "large": (("больш", _RU_STRESSED), ("крупн", _RU_HARD)),
    }
    positions: ClassVar[Phrases] = {
        "left": ("слева", "с левой стороны"),
        "right": ("справа", "с правой стороны"),
        "top": ("сверху", "вверху"),
        "bottom": ("снизу", "внизу"),
        "centre": ("в центре", "посередине"),
    }
    backgrounds: ClassVar[Phrases] = {
        "grey": ("на сером фоне",),
        "white": ("на белом фоне",),
        "black": ("на чёрном фоне",),
        "stripes": ("на полосатом фоне", "на фоне в полоску"),
        "dots": ("на фоне в горошек", "на фоне в точку"),
        "checks": ("на клетчатом фоне", "на фоне в клетку"),
        "gradient": ("на градиентном фоне", "на фоне с градиентом"),
    }
    relations: ClassVar[RelationWords] = {
        ("left-of", False): (("слева от", "gen"),),
        ("left-of", True): (("справа от", "gen"),),
        ("above", False): (("над", "ins"), ("выше", "gen")),
        ("above", True): (("под", "ins"), ("ниже", "gen")),
    }

    def noun_phrase(
        self, rng: Random, shape: str | None, colour: str | None, size: str | None, case: str
    ) -> str:
        entry = rng.choice(self.shapes[shape]) if shape else rng.choice(self.generic)
        gender, case_index = entry[3], _RU_CASES.index(case)
        words = []
        for table, value in ((self.sizes, size), (self.colours, colour)):
            if value:
                stem, declension = rng.choice(table[value])
                words.append(stem + declension[gender][case_index])
        words.append(entry[case_index])
        return " ".join(words)

    def caption(self, rng: Random, mention: Mapping[str, str], flipped: bool = False) -> str:
        return _RU_SO.sub(r"\1со ", super().caption(rng, mention, flipped))


PHRASEBOOKS: dict[str, Phrasebook] = {
    book.code: book for book in (English(), German(), Spanish(), Russian())
}
