"""Local-copy benchmark loaders: each fixture is hand-written in the published format of its set."""
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt_jax.eval import datasets as ds

SHORT = "Answer with the option letter only."


def write_parquet(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_arrow(path, rows, stream=True):
    """Stream format is what HF `datasets` writes (save_to_disk and its cache files)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    table = pa.Table.from_pylist(rows)
    open_writer = pa.ipc.new_stream if stream else pa.ipc.new_file
    with pa.OSFile(path, "wb") as sink, open_writer(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def touch(root, *relative):
    """Loaders only check existence, so a few bytes stand in for each video."""
    for rel in relative:
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"\x00" * 16)
    return str(root)


def videomme_rows():
    base = dict(duration="short", domain="Knowledge", sub_category="Humanity & History",
                task_type="Counting Problem")
    return [
        dict(base, video_id="001", videoID="vidA", question_id="001-1",
             question="How many candles are lit?", options=["A. One.", "B. Two.", "C. Three.", "D. Four."],
             answer="C"),
        dict(base, video_id="001", videoID="vidA", question_id="001-2", duration="long",
             task_type="Object Reasoning", question="What is on the table?",
             options=["A. Apples.", "B. Candles.", "C. Books.", "D. Cups."], answer="B"),
        dict(base, video_id="002", videoID="vidGone", question_id="002-1", question="Who speaks?",
             options=["A. Nobody.", "B. A man.", "C. A woman.", "D. A child."], answer="A"),
    ]


@pytest.fixture
def videomme(tmp_path):
    """A sharded Video-MME parquet directory (plus a decoy split) and a video folder."""
    rows = videomme_rows()
    write_parquet(str(tmp_path / "ann/videomme/test-00000-of-00002.parquet"), rows[:2])
    write_parquet(str(tmp_path / "ann/videomme/test-00001-of-00002.parquet"), rows[2:])
    write_parquet(str(tmp_path / "ann/videomme/dev-00000-of-00001.parquet"), rows[:1])
    return str(tmp_path / "ann"), touch(tmp_path / "videos", "vidA.mp4")


def test_videomme_sharded_questions_answers_and_missing(videomme):
    annotations, videos = videomme
    loaded = ds.load_benchmark("videomme", annotations, videos)
    assert [os.path.basename(f) for f in loaded.annotation_files] == [
        "test-00000-of-00002.parquet", "test-00001-of-00002.parquet"]
    assert [s.sample_id for s in loaded.samples] == ["001-1", "001-2"]
    first = loaded.samples[0]
    assert first.question == ("Question: How many candles are lit?\nOptions:\nA. One.\nB. Two.\n"
                              f"C. Three.\nD. Four.\n{SHORT}")
    assert (first.answer, first.is_mcq, first.question_type) == ("C", True, "mcq")
    assert first.options == ("A. One.", "B. Two.", "C. Three.", "D. Four.")
    assert (first.duration, first.task, first.dataset) == ("short", "Counting Problem", "videomme")
    assert first.video_path == os.path.join(os.path.abspath(videos), "vidA.mp4")
    assert (loaded.samples[1].duration, loaded.samples[1].answer) == ("long", "B")
    assert loaded.missing_videos == (os.path.join(os.path.abspath(videos), "vidGone.mp4"),)
    assert loaded.subtitles_found == 0


def test_direct_prompt_mode_changes_the_instruction(videomme):
    direct = ds.mcq_instruction("direct")
    assert "<answer>X</answer>" in direct and "option letter" in direct
    assert ds.mcq_instruction("agentic_general") == SHORT
    loaded = ds.load_benchmark("videomme", *videomme, prompt_mode="direct")
    assert loaded.samples[0].question.endswith("D. Four.\n" + direct)


def test_limit_keeps_the_first_rows(videomme):
    assert [s.sample_id for s in ds.load_benchmark("videomme", *videomme, limit=1).samples] == ["001-1"]
    loaded = ds.load_benchmark("videomme", *videomme, limit=2)
    assert len(loaded.samples) == 2 and loaded.missing_videos == ()


def test_options_get_their_letter_once():
    assert ds.lettered(["A. Apples.", "Pears", "B. not mine"]) == ("A. Apples.", "B. Pears", "C. B. not mine")


def test_parse_srt_drops_indices_timings_and_tags(tmp_path):
    srt = tmp_path / "x.srt"
    srt.write_bytes(b"1\r\n00:00:01,000 --> 00:00:02,500\r\n<i>Hello</i> there\r\n\r\n"
                    b"2\r\n00:00:03,000 --> 00:00:04,000\r\n<font color=\"red\">Two</font>\r\nlines\r\n\r\n"
                    b"3\r\n00:00:05,000 --> 00:00:06,000\r\n\r\n")
    assert ds.parse_srt(str(srt)) == "Hello there\nTwo\nlines"
    assert ds.parse_srt(str(tmp_path / "absent.srt")) == ""


def test_videomme_with_subtitles(videomme, tmp_path):
    subs = tmp_path / "subtitle"
    subs.mkdir()
    (subs / "vidA.srt").write_text("1\n00:00:00,000 --> 00:00:01,000\n<b>Welcome</b>\n\n"
                                  "2\n00:00:01,000 --> 00:00:02,000\nback\n")
    loaded = ds.load_benchmark("videomme_wsub", *videomme, subtitle_dir=str(subs))
    assert loaded.subtitles_found == 2 and loaded.name == "videomme_wsub"
    assert loaded.samples[0].question == (
        "This video's subtitles are listed below:\nWelcome\nback\n\nQuestion: How many candles are "
        f"lit?\nOptions:\nA. One.\nB. Two.\nC. Three.\nD. Four.\n{SHORT}")
    assert loaded.samples[0].dataset == "videomme_wsub"
    (subs / "vidA.srt").unlink()
    bare = ds.load_benchmark("videomme_wsub", *videomme, subtitle_dir=str(subs))
    assert bare.subtitles_found == 0 and bare.samples[0].question.startswith("Question: ")
    with pytest.raises(ValueError, match="subtitle_dir"):
        ds.load_benchmark("videomme_wsub", *videomme)
    with pytest.raises(ValueError, match="subtitle_dir"):
        ds.load_benchmark("videomme", *videomme, subtitle_dir=str(subs))
    with pytest.raises(FileNotFoundError, match="nowhere.*srt"):
        ds.load_benchmark("videomme_wsub", *videomme, subtitle_dir=str(tmp_path / "nowhere"))


def lvb_row(**kw):
    row = dict(video_id="v", question="Q?", option0="", option1="", option2="", option3="N/A",
               option4="N/A", correct_choice=0, id="x", video_path="x.mp4", duration_group=600,
               question_category="TOS", subtitle_path="x_en.json")
    return row | kw


def test_longvideobench_from_save_to_disk_arrow(tmp_path):
    """`save_to_disk` layout: <dir>/<split>/data-00000-of-00001.arrow plus json metadata."""
    rows = [lvb_row(id="86CxyhFV9MI_0", video_id="86CxyhFV9MI", video_path="86CxyhFV9MI.mp4",
                    question="What does the man hold?", option0="A cup", option1="A phone",
                    option2="A book", correct_choice=2),
            lvb_row(id="k_1", video_path="k.mp4", option0="yes", option1="no", correct_choice=1,
                    duration_group=15),
            lvb_row(id="gone_0", video_path="gone.mp4", option0="a", option1="b")]
    root = tmp_path / "lvb"
    write_arrow(str(root / "validation/data-00000-of-00001.arrow"), rows)
    write_arrow(str(root / "test/data-00000-of-00001.arrow"), rows[:1])
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["test", "validation"]}))
    videos = touch(tmp_path / "videos", "86CxyhFV9MI.mp4", "k.mp4")
    loaded = ds.load_benchmark("longvideobench", str(root), videos)
    first, second = loaded.samples
    assert first.question == ("Question: What does the man hold?\nOptions:\nA. A cup\nB. A phone\n"
                              f"C. A book\n{SHORT}")
    assert (first.sample_id, first.answer, first.duration, first.task) == ("86CxyhFV9MI_0", "C", "600", "TOS")
    assert second.options == ("A. yes", "B. no") and second.answer == "B" and second.duration == "15"
    assert [os.path.basename(p) for p in loaded.missing_videos] == ["gone.mp4"]


def test_missing_field_names_file_row_and_field(tmp_path):
    rows = [lvb_row(option0="a", option1="b"), lvb_row(option0="a", option1="b", correct_choice=None)]
    path = write_arrow(str(tmp_path / "lvb.arrow"), rows)
    with pytest.raises(ValueError, match=r"lvb\.arrow: row 1: missing required field 'correct_choice'"):
        ds.load_benchmark("longvideobench", path, touch(tmp_path / "v", "x.mp4"))


def test_lvbench_from_arrow_ipc_file(tmp_path):
    question = "What year appears in the opening caption?\n(A) 1636\n(B) 1366\n(C) 1363\n(D) 1633"
    rows = [dict(uid="154", video_path="Cm73.mp4", question=question, answer="B",
                 question_type=["key information retrieval"], time_reference="00:15-00:19"),
            dict(uid="155", video_path="Cm73.mp4", question="Who?\n(A) x\n(B) y", answer="A",
                 question_type=["entity recognition", "reasoning"], time_reference=""),
            dict(uid="156", video_path="absent.mp4", question="?\n(A) x", answer="A",
                 question_type=[], time_reference="")]
    path = write_arrow(str(tmp_path / "lvbench.arrow"), rows, stream=False)
    loaded = ds.load_benchmark("lvbench", path, touch(tmp_path / "v", "Cm73.mp4"))
    first, second = loaded.samples
    assert first.question == f"{question}\n{SHORT}"
    assert first.options == ("A. 1636", "B. 1366", "C. 1363", "D. 1633")
    assert (first.sample_id, first.answer, first.task) == ("154", "B", "key information retrieval")
    assert second.task == "entity recognition, reasoning"
    assert len(loaded.missing_videos) == 1


def mlvu_rows():
    return [dict(video_name="1_plotQA/movie101_66.mp4", duration=246.0, question="What color is the car?",
                 candidates=["Red", "Blue", "Green", "Black"], answer="Green", task_type="plotQA"),
            dict(video_name="count/c1.mp4", duration=100.0, question="How many dogs?",
                 candidates=["1", "2", "3"], answer=" 2 ", task_type="count"),
            dict(video_name="count/absent.mp4", duration=100.0, question="How many?",
                 candidates=["1", "2"], answer="1", task_type="count")]


def test_mlvu_answer_text_becomes_letter(tmp_path):
    path = write_parquet(str(tmp_path / "mlvu/test-00000-of-00001.parquet"), mlvu_rows())
    videos = touch(tmp_path / "MLVU/video", "1_plotQA/movie101_66.mp4", "count/c1.mp4")
    loaded = ds.load_benchmark("mlvu", path, videos)
    first, second = loaded.samples
    assert first.question == ("Question: What color is the car?\nOptions:\nA. Red\nB. Blue\nC. Green\n"
                              f"D. Black\n{SHORT}")
    assert (first.answer, first.sample_id, first.task) == ("C", "plotQA-0", "plotQA")
    assert (second.answer, second.sample_id) == ("B", "count-1")
    bad = mlvu_rows()
    bad[1]["answer"] = "7"
    write_parquet(path, bad)
    with pytest.raises(ValueError, match=r"row 1: answer '7' matches none"):
        ds.load_benchmark("mlvu", path, videos)


def mmvu_row(video, **kw):
    choices = dict(A="Oil", B="Watercolour", C="Acrylic", D="Tempera", E="")
    return dict(id="mmvu-1", video=video, question="Which medium is used?", choices=choices,
                answer="B", question_type="multiple-choice", subject="Art") | kw


def test_mmvu_video_urls(tmp_path):
    url = "https://huggingface.co/datasets/yale-nlp/MMVU/resolve/main/videos/Art/0.mp4"
    rows = [mmvu_row(url), mmvu_row("videos/Art/1.mp4", id="mmvu-2", answer=" A "),
            mmvu_row("videos/Art/absent.mp4", id="mmvu-3")]
    path = write_parquet(str(tmp_path / "mmvu/validation-00000-of-00001.parquet"), rows)
    videos = touch(tmp_path / "snapshot", "videos/Art/0.mp4", "videos/Art/1.mp4")
    loaded = ds.load_benchmark("mmvu", str(tmp_path / "mmvu"), videos)
    first, second = loaded.samples
    assert first.video_path == os.path.join(os.path.abspath(videos), "videos", "Art", "0.mp4")
    assert first.question == ("Question: Which medium is used?\nOptions:\nA. Oil\nB. Watercolour\n"
                              f"C. Acrylic\nD. Tempera\n{SHORT}")
    assert (first.answer, first.task, second.answer, second.sample_id) == ("B", "Art", "A", "mmvu-2")
    assert len(loaded.missing_videos) == 1
    write_parquet(path, [mmvu_row("https://example.com/videos/Art/0.mp4")])
    with pytest.raises(ValueError, match=r"row 0: .*'https://example.com/videos/Art/0.mp4'"):
        ds.load_benchmark("mmvu", path, videos)


def test_charades_grounding(tmp_path):
    rows = [dict(video="3MSZA.mp4", caption="person turn a light on.", timestamp=[24.3, 30.4]),
            dict(video="3MSZA.mp4", caption="person opens a door.", timestamp=[0.0, 6.9]),
            dict(video="GONE1.mp4", caption="person sits.", timestamp=[1.0, 2.0])]
    path = write_arrow(str(tmp_path / "charades_sta-test.arrow"), rows)
    loaded = ds.load_benchmark("charades", path, touch(tmp_path / "Charades_v1_480", "3MSZA.mp4"))
    first, second = loaded.samples
    assert (first.is_mcq, first.question_type, first.span, first.sample_id) == (False, "tvg", (24.3, 30.4), "0")
    assert first.key == "3MSZA.mp4>>>person turn a light on.>>>[24.3, 30.4]"
    assert "'The event happens in the start time - end time'" in first.question
    assert "24.3 - 30.4 seconds" in first.question
    assert first.question.count('"person turn a light on."') == 1
    assert second.span == (0.0, 6.9) and second.sample_id == "1"
    assert len(loaded.missing_videos) == 1


def test_layout_errors(tmp_path, videomme):
    annotations, videos = videomme
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet.*videoID, question, options"):
        ds.load_benchmark("videomme", str(tmp_path / "nope.parquet"), videos)
    with pytest.raises(FileNotFoundError, match=r"no_videos.*<videoID>\.mp4"):
        ds.load_benchmark("videomme", annotations, str(tmp_path / "no_videos"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty.*parquet"):
        ds.load_benchmark("charades", str(tmp_path / "empty"), videos)
    with pytest.raises(ValueError, match="known: .*charades.*videomme"):
        ds.load_benchmark("kinetics", annotations, videos)
    (tmp_path / "ann.json").write_text("[]")
    with pytest.raises(ValueError, match=r"ann\.json: unsupported"):
        ds.load_benchmark("videomme", str(tmp_path / "ann.json"), videos)


@pytest.fixture(scope="session")
def builtin(tmp_path_factory):
    from paravt_jax.data.builtin import ensure_builtin

    # Three held-out rows cover mcq, tvg and oe (question types cycle with the row index).
    return ensure_builtin(str(tmp_path_factory.mktemp("builtin")), num_train=3, num_eval=3,
                          durations=(30.0,))


def test_synthetic_builtin_eval_set(builtin):
    from paravt_jax.data.paravt_parquet import load_rl_rows

    rows, _ = load_rl_rows(os.path.join(builtin.data_dir, "rl_eval.parquet"), builtin.data_dir)
    loaded = ds.load_benchmark("synthetic", builtin.data_dir, builtin.data_dir)
    assert loaded.annotation_files == (os.path.join(builtin.data_dir, "rl_eval.parquet"),)
    assert [s.question_type for s in loaded.samples] == ["mcq", "tvg", "oe"] and not loaded.missing_videos
    mcq, tvg, oe = loaded.samples
    assert [s.question for s in loaded.samples] == [r.question for r in rows]
    assert [s.video_path for s in loaded.samples] == [r.video_path for r in rows]
    assert mcq.is_mcq and mcq.answer in "ABCD" and len(mcq.options) == 4
    assert mcq.options[0].startswith("A. ") and mcq.options[0] in mcq.question
    assert not tvg.is_mcq and tvg.answer == f"[{tvg.span[0]:.1f}, {tvg.span[1]:.1f}]"
    assert 0 <= tvg.span[0] < tvg.span[1] <= 30.0
    assert not oe.is_mcq and oe.span is None and oe.answer == rows[2].answer


def test_synthetic_missing_video_and_bad_answer(builtin, tmp_path):
    table = pq.read_table(os.path.join(builtin.data_dir, "rl_eval.parquet")).to_pylist()
    table[0]["videos"] = [{"video": "videos/absent.mp4"}]
    path = write_parquet(str(tmp_path / "rl_eval.parquet"), table)
    loaded = ds.load_benchmark("synthetic", path, builtin.data_dir)
    assert len(loaded.samples) == 2 and loaded.missing_videos[0].endswith("absent.mp4")
    table[1]["extra_info"] = json.dumps({"answer": "soon", "question_type": "tvg"})
    write_parquet(path, table)
    with pytest.raises(ValueError, match=r"row 1: tvg answer 'soon'"):
        ds.load_benchmark("synthetic", path, builtin.data_dir)
