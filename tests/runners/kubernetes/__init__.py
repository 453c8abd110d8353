"""The kubernetes runner over HTTP against kmock emulators: manifests, dispatch, reconcile, logs, pool sync."""
