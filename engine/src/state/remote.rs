//! Checkpoints on object storage: a `checkpoint.location` of
//! `s3://bucket/prefix` (also `s3a://`), `gs://bucket/prefix` or
//! `az://container/prefix` keeps every checkpoint file as an object there,
//! through the `object_store` crate; `file:///path` is a local directory.
//!
//! Every file operation of the checkpoint and the state chains (see
//! `codec`) asks [`of`] whether its path names an object store; one that
//! does goes there, anything else to local disk. So the checkpoint's
//! layout, its records and their checks are the same on both.
//!
//! - A put is atomic (an object appears whole or not at all), which is
//!   what the temporary-file-and-rename dance gives on disk.
//! - Credentials and endpoints come from the standard environment of each
//!   store (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
//!   `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, instance metadata;
//!   `GOOGLE_SERVICE_ACCOUNT`, ...; `AZURE_STORAGE_ACCOUNT_NAME`, ...), read
//!   once per bucket and process.
//! - A store that cannot be reached fails the epoch as an outage, which the
//!   query retries (see `epoch`).
//!
//! The checkpoint code is synchronous, so each request runs on a small
//! runtime of its own and the caller's thread waits for it, as it would
//! for a disk.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::error::{Result, SluiceError};

/// The URL schemes that name an object store.
const SCHEMES: &[&str] = &["s3://", "s3a://", "gs://", "az://"];

/// Whether `location` names an object store rather than a local directory.
pub(crate) fn is_remote(location: &Path) -> bool {
    location
        .to_str()
        .is_some_and(|l| SCHEMES.iter().any(|s| l.starts_with(s)))
}

/// `location` as the checkpoint code takes it: a `file://` URL is the
/// local directory it names; anything else stays as it is.
pub(crate) fn local_or_remote(location: PathBuf) -> PathBuf {
    match location.to_str().and_then(|l| l.strip_prefix("file://")) {
        Some(path) => PathBuf::from(path),
        None => location,
    }
}

/// One object (or prefix) of an object store.
pub(crate) struct Remote {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    /// The URL, for messages.
    url: String,
}

/// The object `path` names, when it is on an object store (see
/// [`is_remote`]).
pub(crate) fn of(path: &Path) -> Result<Option<Remote>> {
    if !is_remote(path) {
        return Ok(None);
    }
    let url = path.to_string_lossy().into_owned();
    let (scheme, rest) = url.split_once("://").unwrap_or(("", &url));
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    let store = store(scheme, bucket)?;
    let path = ObjectPath::parse(key.trim_end_matches('/')).map_err(|e| {
        SluiceError::config(format!(
            "checkpoint location {url} is not a valid object path: {e}"
        ))
    })?;
    Ok(Some(Remote { store, path, url }))
}

/// The store of `scheme://bucket`, made once per process.
fn store(scheme: &str, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    let root = format!("{scheme}://{bucket}");
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(store) = stores.get(&root) {
        return Ok(Arc::clone(store));
    }
    let built: object_store::Result<Arc<dyn ObjectStore>> = match scheme {
        "s3" | "s3a" => object_store::aws::AmazonS3Builder::from_env()
            .with_url(&root)
            .build()
            .map(|s| Arc::new(s) as _),
        "gs" => object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_url(&root)
            .build()
            .map(|s| Arc::new(s) as _),
        _ => object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_url(&root)
            .build()
            .map(|s| Arc::new(s) as _),
    };
    let store = built.map_err(|e| {
        SluiceError::config(format!(
            "checkpoint location {root}: {e}; credentials and endpoint come from the store's \
             environment variables (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, \
             AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP)"
        ))
    })?;
    stores.insert(root, Arc::clone(&store));
    Ok(store)
}

/// Runs `request` on the stores' runtime and waits for it.
fn run<T: Send + 'static>(
    request: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    let runtime = RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("sluice-checkpoint-store")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| SluiceError::Internal(format!("the checkpoint store's runtime: {e}")))?;
    let (done, result) = std::sync::mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = done.send(request.await);
    });
    result
        .recv()
        .map_err(|_| SluiceError::Internal("a checkpoint store request was dropped".into()))
}

impl Remote {
    /// `e` as the query's error: the store's refusal (credentials it does
    /// not accept, a bucket that does not exist) stops the query at once,
    /// since no retry changes it; any other failure is an outage, retried
    /// until `outage.limit`.
    fn failed(&self, what: &str, e: object_store::Error) -> SluiceError {
        let refused = match &e {
            object_store::Error::Unauthenticated { .. }
            | object_store::Error::PermissionDenied { .. } => Some(
                "the store refuses these credentials: check AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY (or the store's own variables) and the bucket's policy",
            ),
            // Only writing can miss: a missing object is read as none.
            object_store::Error::NotFound { .. } => Some(
                "the bucket (or container) does not exist: create it, or name an existing one \
                 in 'checkpoint.location'",
            ),
            _ => None,
        };
        if let Some(hint) = refused {
            return SluiceError::External {
                what: format!("checkpoint store, {what} {}", self.url),
                message: e.to_string(),
                hint: Some(hint.into()),
            };
        }
        SluiceError::Unreachable {
            what: format!("checkpoint store, {what} {}", self.url),
            message: e.to_string(),
            hint: Some(
                "check that the store is reachable and the credentials in its environment \
                 variables are right; the query retries until 'outage.limit'"
                    .into(),
            ),
        }
    }

    /// Writes the object whole, atomically.
    pub(crate) fn put(&self, bytes: Vec<u8>) -> Result<()> {
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        run(async move { store.put(&path, PutPayload::from(bytes)).await })?
            .map(|_| ())
            .map_err(|e| self.failed("writing", e))
    }

    /// The object's bytes; an error naming it when there is none.
    pub(crate) fn get(&self) -> Result<Vec<u8>> {
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        let got = run(async move {
            let found = store.get(&path).await?;
            found.bytes().await
        })?;
        match got {
            Ok(bytes) => Ok(bytes.to_vec()),
            Err(object_store::Error::NotFound { .. }) => Err(SluiceError::io(
                format!("reading {}", self.url),
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such object"),
            )),
            Err(e) => Err(self.failed("reading", e)),
        }
    }

    /// The object's size, or `None` when there is none.
    pub(crate) fn len(&self) -> Result<Option<u64>> {
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        match run(async move { store.head(&path).await })? {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed("reading", e)),
        }
    }

    /// Deletes the object; one already gone is fine.
    pub(crate) fn delete(&self) -> Result<()> {
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        match run(async move { store.delete(&path).await })? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.failed("deleting", e)),
        }
    }

    /// The names directly under this prefix: objects and deeper prefixes
    /// (the "files and folders" of a directory), sorted.
    pub(crate) fn list(&self) -> Result<Vec<String>> {
        let (store, path) = (Arc::clone(&self.store), self.path.clone());
        let listed = run(async move {
            let prefix = (!path.as_ref().is_empty()).then_some(&path);
            store.list_with_delimiter(prefix).await
        })?
        .map_err(|e| self.failed("listing", e))?;
        let mut names: Vec<String> = listed
            .objects
            .iter()
            .map(|o| &o.location)
            .chain(&listed.common_prefixes)
            .filter_map(|p| p.filename().map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }
}
