//! What every physical node of this crate shares: each is a leaf (no
//! children, no physical expressions of its own) with one partition, its
//! `PlanProperties` cached in a `properties` field.

use std::sync::Arc;

use arrow_schema::SchemaRef;
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::{ExecutionPlan, Partitioning, PlanProperties};

/// The `ExecutionPlan` methods of a leaf node named `$name` whose struct
/// has a `properties: Arc<PlanProperties>` field: `name`, `properties`,
/// `children`, `apply_expressions`, `with_new_children`.
macro_rules! leaf_methods {
    ($name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self.properties
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::common::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::common::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }

        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::common::Result<
            std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>,
        > {
            crate::leaf::no_children($name, &children)?;
            Ok(self)
        }
    };
}
pub(crate) use leaf_methods;

/// Refuses children for the leaf `name`.
pub(crate) fn no_children(name: &str, children: &[Arc<dyn ExecutionPlan>]) -> Result<()> {
    if children.is_empty() {
        Ok(())
    } else {
        Err(DataFusionError::Internal(format!("{name} has no children")))
    }
}

/// Refuses any partition but 0 for the leaf `name`.
pub(crate) fn one_partition(name: &str, partition: usize) -> Result<()> {
    if partition == 0 {
        Ok(())
    } else {
        Err(DataFusionError::Internal(format!(
            "{name} has one partition, asked for {partition}"
        )))
    }
}

/// The properties of a bounded leaf with one partition producing `schema`.
pub(crate) fn properties(schema: SchemaRef, emission: EmissionType) -> Arc<PlanProperties> {
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(schema),
        Partitioning::UnknownPartitioning(1),
        emission,
        Boundedness::Bounded,
    ))
}
