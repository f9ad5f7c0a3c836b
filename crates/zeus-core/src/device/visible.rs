//! `CUDA_VISIBLE_DEVICES` and AMD's variables: which backend devices this process sees, and in
//! which order.
//!
//! CUDA accepts integer indices and `GPU-<uuid>` (or a unique prefix of it). CUDA silently stops
//! at the first entry it cannot parse; we raise instead, because a typo here would otherwise
//! measure or power-cap the wrong GPU. On AMD, ROCr's `ROCR_VISIBLE_DEVICES` selects first,
//! then HIP's `HIP_VISIBLE_DEVICES` (or, where that is unset, `CUDA_VISIBLE_DEVICES`, which HIP
//! also honours) selects among what ROCr left, by the same rules.

use super::{GpuError, GpuResult, Vendor};

/// The backend indices visible to this process, in framework order, for GPUs of `vendor`
/// with these UUIDs, from the environment.
pub fn from_env(vendor: Vendor, uuids: &[String]) -> GpuResult<Vec<usize>> {
    let var = |name: &str| std::env::var(name).ok();
    match vendor {
        Vendor::Nvidia => resolve(var("CUDA_VISIBLE_DEVICES").as_deref(), uuids),
        Vendor::Amd => {
            let rocr = resolve_named(
                "ROCR_VISIBLE_DEVICES",
                var("ROCR_VISIBLE_DEVICES").as_deref(),
                uuids,
            )?;
            let (name, value) = match var("HIP_VISIBLE_DEVICES") {
                Some(v) => ("HIP_VISIBLE_DEVICES", Some(v)),
                None => ("CUDA_VISIBLE_DEVICES", var("CUDA_VISIBLE_DEVICES")),
            };
            let left: Vec<String> = rocr.iter().map(|&i| uuids[i].clone()).collect();
            let hip = resolve_named(name, value.as_deref(), &left)?;
            Ok(hip.into_iter().map(|i| rocr[i]).collect())
        }
    }
}

/// Resolve `CUDA_VISIBLE_DEVICES`'s value (`None` = unset) against the backend devices'
/// UUIDs into the backend indices visible to this process, in framework order.
pub fn resolve(value: Option<&str>, uuids: &[String]) -> GpuResult<Vec<usize>> {
    resolve_named("CUDA_VISIBLE_DEVICES", value, uuids)
}

/// [`resolve`] for the variable `var` (its name goes into the errors).
pub fn resolve_named(var: &str, value: Option<&str>, uuids: &[String]) -> GpuResult<Vec<usize>> {
    let Some(value) = value else {
        return Ok((0..uuids.len()).collect());
    };
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Err(GpuError::InvalidArg(format!(
            "{var} is set but empty, so no GPU is visible"
        )));
    }
    let mut out: Vec<usize> = Vec::new();
    for raw in trimmed.split(',') {
        let entry = raw.trim();
        let idx = if let Ok(i) = entry.parse::<usize>() {
            if i >= uuids.len() {
                return Err(GpuError::InvalidArg(format!(
                    "{var}={value:?} names GPU {i}, but only {} GPU(s) exist (indices 0..{})",
                    uuids.len(),
                    uuids.len().saturating_sub(1)
                )));
            }
            i
        } else if entry.len() > 4 && entry[..4].eq_ignore_ascii_case("GPU-") {
            let matches: Vec<usize> = uuids
                .iter()
                .enumerate()
                .filter(|(_, u)| {
                    u.to_ascii_lowercase()
                        .starts_with(&entry.to_ascii_lowercase())
                })
                .map(|(i, _)| i)
                .collect();
            match matches.as_slice() {
                [i] => *i,
                [] => {
                    return Err(GpuError::InvalidArg(format!(
                        "{var}={value:?}: no GPU has a UUID starting with {entry:?}"
                    )))
                }
                _ => {
                    return Err(GpuError::InvalidArg(format!(
                        "{var}={value:?}: {entry:?} matches more than one GPU UUID"
                    )))
                }
            }
        } else {
            return Err(GpuError::InvalidArg(format!(
                "{var}={value:?}: entry {entry:?} is neither an index nor a GPU-<uuid>"
            )));
        };
        if out.contains(&idx) {
            return Err(GpuError::InvalidArg(format!(
                "{var}={value:?} lists GPU {idx} twice"
            )));
        }
        out.push(idx);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn uuids(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}"))
            .collect()
    }

    #[test]
    fn unset_means_all() {
        assert_eq!(resolve(None, &uuids(3)).unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn indices_reorder() {
        assert_eq!(resolve(Some("2,0"), &uuids(3)).unwrap(), vec![2, 0]);
        assert_eq!(resolve(Some(" 1 "), &uuids(3)).unwrap(), vec![1]);
    }

    #[test]
    fn uuid_and_prefix() {
        let u = uuids(3);
        assert_eq!(resolve(Some(&u[1]), &u).unwrap(), vec![1]);
        assert_eq!(resolve(Some("GPU-00000002"), &u).unwrap(), vec![2]);
        assert_eq!(resolve(Some("gpu-00000002,0"), &u).unwrap(), vec![2, 0]);
    }

    #[test]
    fn bad_values_name_themselves() {
        let u = uuids(2);
        let e = resolve(Some("0,5"), &u).unwrap_err();
        assert!(matches!(e, GpuError::InvalidArg(_)));
        assert!(e.to_string().contains("GPU 5"), "{e}");
        let e = resolve(Some("zero"), &u).unwrap_err();
        assert!(e.to_string().contains("\"zero\""), "{e}");
        assert!(resolve(Some(""), &u).is_err());
        assert!(resolve(Some("0,0"), &u)
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(resolve(Some("GPU-ffff"), &u).is_err());
        assert!(resolve(Some("GPU-0000000"), &u)
            .unwrap_err()
            .to_string()
            .contains("more than one"));
    }

    proptest! {
        #[test]
        fn any_permutation_of_indices_resolves_to_itself(perm in Just((0..6usize).collect::<Vec<_>>()).prop_shuffle(), k in 1usize..=6) {
            let chosen = &perm[..k];
            let s = chosen.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
            prop_assert_eq!(resolve(Some(&s), &uuids(6)).unwrap(), chosen.to_vec());
        }
    }
}
