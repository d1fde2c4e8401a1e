"""What a person looks at: the coordinator's live dashboard (GET /dashboard,
with `--dashboard`) and a demo run's static report page (`shoal report`).
Both are single self-contained pages: no CDN, no fonts or scripts fetched."""
