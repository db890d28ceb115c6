//! The learner's side of data-parallel training: [`CollectiveSync`] implements the algorithms'
//! [`GradientSync`] on a c10d process group (flotilla-collective), with the configured gradient compression.
use std::sync::{Arc, Mutex};

use flotilla_algorithms::{Error as AlgorithmError, GradientSync};
use flotilla_collective::ProcessGroup;
use flotilla_collective::codec::{Compression, GradientCodec};
use tch::{Device, Kind, Tensor};

/// A process group shared by the algorithm's gradient sync and the learner's own collectives (parameter
/// broadcast, agreement checks, metric aggregation). All use it from the update thread, one at a time.
pub type SharedGroup = Arc<Mutex<ProcessGroup>>;

fn lock(group: &SharedGroup) -> std::sync::MutexGuard<'_, ProcessGroup> {
    group.lock().unwrap_or_else(|e| e.into_inner())
}

/// Averages gradients over the group's ranks (compressed as configured) and sums loss statistics.
#[derive(Debug)]
pub struct CollectiveSync {
    group: SharedGroup,
    codec: GradientCodec,
    world: usize,
}

impl CollectiveSync {
    /// A sync over `group`, compressing gradients with `compression`.
    pub fn new(group: SharedGroup, compression: Compression) -> Self {
        let world = lock(&group).world_size();
        CollectiveSync { group, codec: GradientCodec::new(compression), world }
    }
}

impl GradientSync for CollectiveSync {
    fn mean_gradient(&mut self, grad: &mut Tensor) -> flotilla_algorithms::Result<()> {
        let mut group = lock(&self.group);
        self.codec.all_reduce_mean(&mut group, grad).map_err(|e| AlgorithmError::Sync(e.to_string()))
    }

    fn sum(&mut self, values: &mut [f64]) -> flotilla_algorithms::Result<()> {
        let mut t = Tensor::from_slice(values).to_kind(Kind::Double).to_device(Device::Cpu);
        lock(&self.group).all_reduce_sum(&mut t).map_err(|e| AlgorithmError::Sync(e.to_string()))?;
        values.copy_from_slice(&Vec::<f64>::try_from(&t).map_err(AlgorithmError::from)?);
        Ok(())
    }

    fn replicas(&self) -> usize {
        self.world
    }
}
