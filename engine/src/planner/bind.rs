//! Binding: each stream scan of a query gets the query's own source and
//! table instance, so that each epoch's input reaches exactly this query.

use std::collections::BTreeSet;
use std::sync::Arc;

use datafusion::catalog::TableProvider;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::logical_expr::LogicalPlan;

use super::Input;
use crate::connector::ConnectorRegistry;
use crate::error::Result;
use crate::table::replace_stream_scans;
use crate::task::TaskId;

/// `plan` with each stream scan bound to a fresh source (for `task` only,
/// when given) and table instance, and the inputs so made, in plan order;
/// their keys start with `key_prefix`. A stream scanned twice (a self-join, a stream on two
/// paths) is one input read once per epoch.
pub(super) fn bind_inputs(
    plan: &LogicalPlan,
    registry: &ConnectorRegistry,
    key_prefix: &str,
    default_partitions: usize,
    task: Option<TaskId>,
) -> Result<(LogicalPlan, Vec<Input>)> {
    let mut inputs: Vec<Input> = Vec::new();
    // The stream tables bound so far (by identity: a DataFrame's streams may
    // share a name) and their inputs.
    let mut bound_tables: Vec<(*const (), usize)> = Vec::new();
    let read = names_read(plan)?;
    let bound = replace_stream_scans(plan.clone(), |table, provider| {
        // A stream scanned again reads the same input: one read per epoch,
        // and every path sees the same rows (and the same late ones),
        // whatever arrives between two reads.
        let identity = Arc::as_ptr(provider) as *const ();
        if let Some(&(_, i)) = bound_tables.iter().find(|(t, _)| *t == identity) {
            let input = &mut inputs[i];
            input.scans += 1;
            return Ok(Some(Arc::clone(&input.table) as Arc<dyn TableProvider>));
        }
        let factory = table.factory(registry, default_partitions)?;
        let source = match task {
            Some(task) => factory.create_task(task)?,
            None => factory.create()?,
        };
        source.columns_read(&read);
        let instance = table.for_query();
        bound_tables.push((identity, inputs.len()));
        inputs.push(Input {
            key: format!("{key_prefix}{}:{}", inputs.len(), table.definition().name),
            table: Arc::clone(&instance),
            source,
            description: format!("{} ← {}", table.definition().name, factory.describe()),
            identity: factory.identity(),
            scans: 1,
        });
        Ok(Some(instance))
    })?;
    Ok((bound, inputs))
}

/// Every column name an expression of `plan` mentions, and the names of
/// its output columns (a stream written out whole reads every column):
/// more than each scan reads, never less, which is what
/// [`Source::columns_read`](crate::Source::columns_read) asks for.
fn names_read(plan: &LogicalPlan) -> Result<BTreeSet<String>> {
    let mut names: BTreeSet<String> = plan
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            names.extend(e.column_refs().into_iter().map(|c| c.name.clone()));
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(names)
}
