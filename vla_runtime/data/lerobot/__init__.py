"""LeRobot dataset format v3.0, written with pyarrow + OpenCV and read with pyarrow + PyAV
(lerobot itself optional).

Layout (as lerobot v3 expects it):

    meta/info.json                      codebase_version "v3.0", fps, features, paths, totals
    meta/stats.json                     every numeric and camera feature: min/max/mean/std/count
                                        and quantiles q01..q99, as lerobot computes them
    meta/tasks.parquet                  task strings (pandas index "task") -> task_index
    meta/tasks.jsonl                    the same, the v2.1 way, for older readers
    meta/episodes/chunk-CCC/file-FFF.parquet   one row per episode (lengths, file locations,
                                        from/to timestamps, per-episode stats; plus ours:
                                        success, seed, sha256 of every file)
    data/chunk-CCC/file-FFF.parquet     frames: observation.state, action, timestamp, indices
    videos/<camera key>/chunk-CCC/file-FFF.mp4

v3 allows several episodes per file; this writer uses one data file and one video per episode
per camera, which keeps every episode self-contained: an interrupted collection loses at most
the episode being written. An episode exists once its meta/episodes row is written (the commit
point, after its data and videos are renamed into place); files without a row are leftovers of
an interruption, reported and ignored by the reader and overwritten by a resumed writer. The
reader also reads datasets of other writers (lerobot's: several episodes per file, AV1 video,
none of our columns).

Modules: `schema` (paths, feature keys, info.json features), `stats` (per-feature statistics),
`video` (mp4 encode/decode), `writer` (`Episode`, `LeRobotWriter`), `reader` (`load_metadata`,
`load_episode`), `roundtrip_check` + `lerobot_side` (`./dev.sh lerobot-check`).
"""
