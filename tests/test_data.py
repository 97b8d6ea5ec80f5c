"""Synthetic world, caption corpus and dataset loaders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from training.data import (
    DEFAULT_DOMAINS,
    DOMAINS,
    LANGUAGES,
    PairDataset,
    caption_corpus,
    generate_items,
    is_relevant,
    load_karpathy,
    load_manifest,
    parallel_corpus,
    render,
    write_dataset,
)
from training.data.languages import PHRASEBOOKS
from training.data.synth import COLOURS, CONTRASTING, SynthItem
from training.errors import DataError

CYRILLIC = re.compile("[\u0400-\u04ff]")


def _words(texts: list[str]) -> set[str]:
    return {word for text in texts for word in text.lower().split()}


def _png(path: Path, rgb: tuple[int, int, int] = (200, 10, 10)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), rgb).save(path)
    return path


# ---------------------------------------------------------------------------------------
# Generator


def test_same_seed_gives_identical_items_and_pixels() -> None:
    first, second = generate_items(15, seed=3), generate_items(15, seed=3)
    assert first == second
    for a, b in zip(first, second):
        assert render(a).tobytes() == render(b).tobytes()


def test_different_seed_gives_different_items() -> None:
    first, other = generate_items(15, seed=3), generate_items(15, seed=4)
    assert [i.attributes for i in first] != [i.attributes for i in other]
    assert render(first[0]).tobytes() != render(other[0]).tobytes()


def test_items_do_not_depend_on_n_or_extra_languages() -> None:
    short = generate_items(5, seed=9, languages=("en",))
    long = generate_items(10, seed=9)
    assert [i.attributes for i in short] == [i.attributes for i in long[:5]]
    assert [i.captions["en"] for i in short] == [i.captions["en"] for i in long[:5]]


def test_domains_are_mixed_evenly_in_order() -> None:
    items = generate_items(10, seed=0)
    assert [i.domain for i in items] == list(DEFAULT_DOMAINS) * 2
    assert len({i.id for i in items}) == 10


def test_at_least_five_parallel_captions_per_language() -> None:
    for item in generate_items(20, seed=1):
        assert set(item.captions) == set(LANGUAGES)
        assert len(item.caption_attributes) >= 5
        for texts in item.captions.values():
            assert len(texts) == len(item.caption_attributes)
            assert all(text.strip() for text in texts)


def test_russian_is_cyrillic_and_languages_use_different_words() -> None:
    items = generate_items(40, seed=2)
    texts = {code: [t for i in items for t in i.captions[code]] for code in LANGUAGES}
    assert all(CYRILLIC.search(t) for t in texts["ru"])
    assert not any(CYRILLIC.search(t) for code in ("en", "de", "es") for t in texts[code])
    english = _words(texts["en"])
    for code in ("de", "es", "ru"):
        shared = english & _words(texts[code])
        # A few function words may coincide ("a"); the vocabulary must be mostly new.
        assert len(shared) / len(_words(texts[code])) < 0.1, (code, shared)
    assert "Kreis" in " ".join(texts["de"]) or "Scheibe" in " ".join(texts["de"])


def test_each_domain_produces_its_shapes_and_backgrounds() -> None:
    for name, spec in DOMAINS.items():
        items = generate_items(60, seed=5, domains=[name])
        if spec.objects == 1:
            shapes = {i.attributes["shape"] for i in items}
        else:
            shapes = {i.attributes[k] for i in items for k in ("a.shape", "b.shape")}
            assert {i.attributes["relation"] for i in items} == {"left-of", "above"}
            assert all(len(i.render["objects"]) == 2 for i in items)
        assert shapes == set(spec.shapes), name
        assert {i.attributes["background"] for i in items} <= set(spec.backgrounds)
    textures = generate_items(40, seed=5, domains=["textures"])
    assert {i.render["background"]["kind"] for i in textures} == {
        "stripes", "dots", "checks", "gradient"
    }  # fmt: skip


def test_object_colour_never_matches_background() -> None:
    for item in generate_items(100, seed=6):
        colours = [v for k, v in item.attributes.items() if k.endswith("colour")]
        assert all(c in CONTRASTING[item.attributes["background"]] for c in colours)
        assert item.attributes["background"] not in colours


def test_render_draws_the_object_in_its_colour() -> None:
    for item in generate_items(30, seed=7, domains=["basic", "polygons", "symbols"]):
        obj = item.render["objects"][0]
        image = render(item, 64)
        assert image.mode == "RGB" and image.size == (64, 64)
        centre = image.getpixel((int(obj["cx"] * 64), int(obj["cy"] * 64)))
        assert np.abs(np.subtract(centre, obj["rgb"])).max() <= 3, item.attributes
        corner = image.getpixel((0, 0))
        assert np.abs(np.subtract(corner, obj["rgb"])).max() > 60


def test_render_size_is_a_parameter() -> None:
    item = generate_items(1, seed=0)[0]
    assert render(item, 32).size == (32, 32)
    assert render(item, 96).size == (96, 96)


def test_english_captions_mention_exactly_their_attributes() -> None:
    book = PHRASEBOOKS["en"]
    sizes = {w for words in book.sizes.values() for w in words}
    for item in generate_items(40, seed=8, domains=["basic", "polygons", "symbols"]):
        for text, mention in zip(item.captions["en"], item.caption_attributes):
            if "shape" in mention:
                assert any(s in text for s in book.shapes[mention["shape"]]), (text, mention)
            if "colour" in mention:
                assert any(c in text for c in book.colours[mention["colour"]]), (text, mention)
            if "position" in mention:
                assert any(p in text for p in book.positions[mention["position"]])
            has_size_word = any(re.search(rf"\b{s}\b", text) for s in sizes)
            assert has_size_word == ("size" in mention), (text, mention)


def test_captions_mix_full_and_partial_mentions() -> None:
    mentions = [m for i in generate_items(50, seed=4) for m in i.caption_attributes]
    counts = [len(m) for m in mentions]
    assert max(counts) >= 5 and min(counts) <= 2
    assert sum(c >= 4 for c in counts) / len(counts) > 0.3
    for item in generate_items(20, seed=4, domains=["pairs"]):
        for mention in item.caption_attributes:
            assert {"a.shape", "b.shape", "relation"} <= set(mention)


def test_pair_captions_use_both_phrasings() -> None:
    texts = [t for i in generate_items(40, seed=3, domains=["pairs"]) for t in i.captions["en"]]
    assert any(" left of " in t for t in texts) and any(" right of " in t for t in texts)
    assert any(" above " in t or " over " in t for t in texts)
    assert any(" below " in t or " under " in t or " beneath " in t for t in texts)


def test_unknown_domain_language_and_bad_n_raise() -> None:
    with pytest.raises(DataError, match="unknown domain.*known domains: basic"):
        generate_items(3, seed=0, domains=["nope"])
    with pytest.raises(DataError, match="unknown language.*known languages: en, de, es, ru"):
        generate_items(3, seed=0, languages=["fr"])
    with pytest.raises(DataError, match="at least 1"):
        generate_items(0, seed=0)
    with pytest.raises(DataError, match="unknown domain"):
        caption_corpus(10, seed=0, domains=["nope"])


# ---------------------------------------------------------------------------------------
# Relevance


def test_is_relevant_on_hand_made_cases() -> None:
    item = {"shape": "circle", "colour": "red", "size": "small", "background": "grey"}
    assert is_relevant(item, {"shape": "circle"})
    assert is_relevant(item, {"shape": "circle", "colour": "red", "size": "small"})
    assert not is_relevant(item, {"shape": "circle", "colour": "blue"})
    assert not is_relevant(item, {"relation": "above"})  # attribute the item lacks
    assert is_relevant(item, {})


def test_every_item_is_relevant_to_its_own_captions() -> None:
    for item in generate_items(50, seed=11):
        assert all(is_relevant(item.attributes, m) for m in item.caption_attributes)


def test_vectorised_relevance_matches_reference() -> None:
    items = generate_items(60, seed=12)
    dataset = PairDataset.from_synth(items)
    matrix = dataset.relevance("de")
    mentions = [m for i in items for m in i.caption_attributes]
    expected = np.array([[is_relevant(i.attributes, m) for i in items] for m in mentions])
    assert matrix.shape == (len(mentions), len(items))
    assert (matrix == expected).all()
    assert matrix.sum() > len(mentions)  # vague captions match other images too


def test_relevance_at_benchmark_size() -> None:
    dataset = PairDataset.from_synth(generate_items(1000, seed=13))
    matrix = dataset.relevance("en")
    assert matrix.shape == (5000, 1000)


def test_pair_relevance_without_attributes(tmp_path: Path) -> None:
    lines = [
        {"image": str(_png(tmp_path / "a.png")), "captions": {"en": ["x", "y"]}},
        {"image": str(_png(tmp_path / "b.png")), "caption": "z"},
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    dataset = load_manifest(tmp_path / "m.jsonl")
    expected = np.array([[True, False], [True, False], [False, True]])
    assert (dataset.relevance("en") == expected).all()


# ---------------------------------------------------------------------------------------
# Dataset operations


def test_filter_subset_split_and_captions() -> None:
    dataset = PairDataset.from_synth(generate_items(20, seed=14), image_size=32)
    pairs = dataset.filter(domains=["pairs"])
    assert len(pairs) == 4 and pairs.domains() == ["pairs"]
    assert pairs.load_image(0).size == (32, 32)
    texts, owners = dataset.subset([3, 1]).captions("ru")
    assert owners == [0] * 5 + [1] * 5 and CYRILLIC.search(texts[0])
    parts = dataset.split([0.5, 0.25, 0.25], seed=0)
    assert [len(p) for p in parts] == [10, 5, 5]
    ids = [r.id for p in parts for r in p.records]
    assert sorted(ids) == sorted(r.id for r in dataset.records)
    with pytest.raises(DataError, match="nope.*available domains"):
        dataset.filter(domains=["nope"])
    with pytest.raises(DataError, match="'fr'.*available"):
        dataset.captions("fr")


def test_filter_by_language() -> None:
    english = PairDataset.from_synth(generate_items(3, seed=0, languages=["en"]))
    assert len(english.filter(language="en")) == 3
    assert english.languages() == ["en"]
    with pytest.raises(DataError, match="language='ru'"):
        english.filter(language="ru")


# ---------------------------------------------------------------------------------------
# Writing and loading


def test_write_dataset_round_trip(tmp_path: Path) -> None:
    manifest = write_dataset(tmp_path / "ds", n=6, seed=21, image_size=48)
    assert manifest == tmp_path / "ds" / "manifest.jsonl"
    items = generate_items(6, seed=21)
    dataset = load_manifest(manifest)
    assert len(dataset) == 6 and dataset.skipped == 0
    for i, (record, item) in enumerate(zip(dataset.records, items)):
        assert record.id == item.id and record.domain == item.domain
        assert record.captions == item.captions
        assert record.attributes == item.attributes
        assert record.caption_attributes == item.caption_attributes
        assert dataset.load_image(i).tobytes() == render(item, 48).tobytes()
    line = json.loads(manifest.read_text(encoding="utf-8").splitlines()[0])
    assert SynthItem.from_json(line) == items[0]


def test_write_dataset_is_byte_identical_for_same_seed(tmp_path: Path) -> None:
    first = write_dataset(tmp_path / "a", n=4, seed=2)
    second = write_dataset(tmp_path / "b", n=4, seed=2)
    assert first.read_bytes() == second.read_bytes()
    for png in sorted((tmp_path / "a" / "images").glob("*.png")):
        assert png.read_bytes() == (tmp_path / "b" / "images" / png.name).read_bytes()


def test_jsonl_manifest_forms_and_paths(tmp_path: Path) -> None:
    absolute = _png(tmp_path / "elsewhere" / "abs.png")
    _png(tmp_path / "img" / "rel.png")
    lines = [
        {"id": "r", "image": "img/rel.png", "captions": {"en": ["a red square"], "de": ["rot"]}},
        {"image": str(absolute), "caption": "another"},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    dataset = load_manifest(path)
    assert [r.id for r in dataset.records] == ["r", "abs"]
    assert dataset.records[0].image_path == tmp_path / "img" / "rel.png"
    assert dataset.languages() == ["en", "de"]
    assert dataset.captions("en")[0] == ["a red square", "another"]
    assert dataset.load_image(1).getpixel((0, 0)) == (200, 10, 10)


def test_malformed_json_line_names_line_number(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    path = tmp_path / "m.jsonl"
    path.write_text('{"image": "a.png", "caption": "ok"}\n{"image": "a.png", \n')
    with pytest.raises(DataError, match="m.jsonl line 2: malformed JSON"):
        load_manifest(path)


def test_csv_manifest_groups_rows_by_image(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    _png(tmp_path / "b.png")
    path = tmp_path / "m.csv"
    path.write_text(
        "image,caption,language\n"
        "a.png,a red thing,en\n"
        "a.png,ein rotes Ding,de\n"
        "b.png,a blue thing,\n"
        'a.png,"another, with comma",en\n'
    )
    dataset = load_manifest(path)
    assert [r.id for r in dataset.records] == ["a.png", "b.png"]
    assert dataset.records[0].captions == {
        "en": ["a red thing", "another, with comma"], "de": ["ein rotes Ding"]
    }  # fmt: skip
    assert dataset.captions("en")[1] == [0, 0, 1]


def test_csv_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("image,text\na.png,hello\n")
    with pytest.raises(DataError, match=r"missing CSV column.*caption"):
        load_manifest(path)


def test_missing_image_error_names_file_and_line(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    path = tmp_path / "m.jsonl"
    path.write_text('{"image": "a.png", "caption": "x"}\n{"image": "gone.png", "caption": "y"}\n')
    with pytest.raises(DataError, match=r"m.jsonl line 2: image file not found: .*gone\.png"):
        load_manifest(path)


def test_corrupt_image_error_names_file(tmp_path: Path) -> None:
    (tmp_path / "bad.png").write_bytes(b"definitely not a png")
    path = tmp_path / "m.jsonl"
    path.write_text('{"image": "bad.png", "caption": "x"}\n')
    dataset = load_manifest(path)  # only existence is checked eagerly without skip_bad
    with pytest.raises(DataError, match=r"bad\.png"):
        dataset.load_image(0)


def test_skip_bad_drops_and_counts_bad_rows(tmp_path: Path) -> None:
    _png(tmp_path / "good.png")
    (tmp_path / "bad.png").write_bytes(b"\x89PNG garbage")
    rows = [
        {"image": "good.png", "caption": "fine"},
        {"image": "bad.png", "caption": "corrupt"},
        {"image": "gone.png", "caption": "missing"},
        {"image": "good.png", "id": "empty", "captions": {"en": []}},
    ]
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    dataset = load_manifest(path, skip_bad=True)
    assert [r.captions["en"] for r in dataset.records] == [["fine"]]
    assert dataset.skipped == 3
    with pytest.raises(DataError, match="line 3"):
        load_manifest(path)


def test_no_captions_is_an_error(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    path = tmp_path / "m.jsonl"
    path.write_text('{"image": "a.png"}\n')
    with pytest.raises(DataError, match="line 1: no captions"):
        load_manifest(path)


def test_caption_attributes_must_cover_every_caption(tmp_path: Path) -> None:
    _png(tmp_path / "a.png")
    row = {"image": "a.png", "captions": {"en": ["x", "y"]}, "caption_attributes": [{}]}
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match="line 1: 2 'en' captions but only 1 caption_attributes"):
        load_manifest(path)


def _karpathy_file(tmp_path: Path) -> Path:
    images = [
        {"filename": "1.jpg", "filepath": "val2014", "split": "test", "cocoid": 1,
         "sentences": [{"raw": "A dog."}, {"raw": "A brown dog. "}]},
        {"filename": "2.jpg", "filepath": "val2014", "split": "train",
         "sentences": [{"raw": "A cat."}]},
        {"filename": "3.jpg", "filepath": "val2014", "split": "restval",
         "sentences": [{"raw": "A bird."}]},
    ]  # fmt: skip
    for entry in images:
        _png(tmp_path / "coco" / entry["filepath"] / entry["filename"])
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": images}))
    return path


def test_karpathy_loader_reads_splits_and_filepaths(tmp_path: Path) -> None:
    path = _karpathy_file(tmp_path)
    test = load_karpathy(path, tmp_path / "coco", split="test")
    assert [r.id for r in test.records] == ["1"]
    assert test.records[0].captions == {"en": ["A dog.", "A brown dog."]}
    assert test.load_image(0).size == (8, 8)
    train = load_karpathy(path, tmp_path / "coco", split="train+restval")
    assert [r.image_path.name for r in train.records] == ["2.jpg", "3.jpg"]
    with pytest.raises(DataError, match="unknown Karpathy split"):
        load_karpathy(path, tmp_path / "coco", split="dev")


def test_karpathy_flickr_layout_and_missing_image(tmp_path: Path) -> None:
    images = [
        {"filename": "f1.jpg", "split": "test", "sentences": [{"raw": "x"}]},
        {"filename": "f2.jpg", "split": "test", "sentences": [{"raw": "y"}]},
    ]
    _png(tmp_path / "flickr" / "f1.jpg")
    path = tmp_path / "dataset_flickr30k.json"
    path.write_text(json.dumps({"images": images}))
    with pytest.raises(DataError, match=r"images\[1\].*f2\.jpg"):
        load_karpathy(path, tmp_path / "flickr")
    dataset = load_karpathy(path, tmp_path / "flickr", skip_bad=True)
    assert len(dataset) == 1 and dataset.skipped == 1


# ---------------------------------------------------------------------------------------
# Caption corpus


def test_caption_corpus_size_language_and_determinism() -> None:
    english = caption_corpus(500, seed=1)
    assert len(english) == 500 and not any(CYRILLIC.search(t) for t in english)
    assert english == caption_corpus(500, seed=1)
    assert english != caption_corpus(500, seed=2)
    assert len(set(english)) > 250  # varied, not a handful of templates
    russian = caption_corpus(300, seed=1, languages=("ru",))
    assert len(russian) == 300 and all(CYRILLIC.search(t) for t in russian)
    mixed = caption_corpus(7, seed=1, languages=("en", "ru"))
    assert len(mixed) == 7 and CYRILLIC.search(mixed[1]) and not CYRILLIC.search(mixed[0])


def test_parallel_corpus_rows_align() -> None:
    corpus = parallel_corpus(50, seed=0, languages=("en", "es"), domains=["pairs"])
    assert len(corpus["en"]) == len(corpus["es"]) == 50
    # Colour words appear in the Spanish row exactly when they appear in the English one.
    for en, es in zip(corpus["en"], corpus["es"]):
        assert ("red" in en.split()) == bool(re.search(r"\broj[oa]\b", es))


def test_caption_corpus_at_training_size() -> None:
    corpus = caption_corpus(100_000, seed=0)
    assert len(corpus) == 100_000
    assert len(set(corpus)) > 1_000  # templates and synonyms give real variety


def test_colour_table_is_distinct() -> None:
    values = list(COLOURS.values())
    assert len(values) == 8
    assert min(np.linalg.norm(np.subtract(a, b)) for a in values for b in values if a != b) > 80
