"""The VOICEVOX engine API on our model, one router per API group as the engine lays them out.

`engine_info` (version, manifest, devices), `speakers` (the configured voices and their
initialisation), `presets`, `tts` (queries, their editing, synthesis; `query.py` maps an
AudioQuery onto the options pipeline) and `user_dict`. Each `make_router` is handed what its
routes use; `server/app.py` includes them. docs/server.md has the compatibility table.
"""
