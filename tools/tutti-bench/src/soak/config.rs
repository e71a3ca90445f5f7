//! A cell's runtime configuration (YAML, as docs/config.md describes it):
//! one store per lane, each on its own emulated RAM drives with the
//! timing model of a Gen4 drive, sized to hold the cell's objects without
//! eviction.

use super::cells::Cell;
use super::Exec;

/// The timing model of every drive: 7 GB/s, 1.5 M IOPS, 80 us per command
/// (the TTFT benchmark's Gen4 drive).
const TIMING: &str = "{ bandwidth_mb_s: 7000, iops: 1500000, latency_us: 80 }";
/// Logical block size of every namespace, bytes.
pub const BLOCK: u64 = 4096;
/// Object slots beyond the cell's keys (a failed put's key is put again).
const SPARE_SLOTS: u64 = 8;

/// Names of lane `lane`'s store and drives.
pub fn store_name(lane: usize) -> String {
    format!("kv{lane}")
}

/// Name of drive `d` of lane `lane`.
pub fn drive_name(lane: usize, d: usize) -> String {
    format!("l{lane}d{d}")
}

/// Capacity of each drive of a store holding `keys` objects of the cell's
/// object size, bytes: the objects, spare slots, the superblock and the
/// record table (64 bytes per slot), in whole stripe units and MiB.
pub fn drive_capacity(cell: &Cell, keys: u64) -> u64 {
    let slots = keys + SPARE_SLOTS;
    let meta = BLOCK + (slots * 64).div_ceil(BLOCK) * BLOCK;
    let total = (slots + meta.div_ceil(cell.object) + 1) * cell.object;
    let unit = if cell.drives > 1 { cell.stripe_unit.max(1 << 20) } else { 1 << 20 };
    total.div_ceil(cell.drives as u64).div_ceil(unit) * unit
}

/// The runtime's YAML: for each lane (its execution in `lanes`), a store
/// `kvN` on drives `lNd0..` holding `keys` objects.
pub fn yaml(cell: &Cell, lanes: &[Exec], keys: u64) -> String {
    let capacity = drive_capacity(cell, keys);
    let mut drives = String::from("drives:\n");
    let mut datapaths = String::from("datapaths:\n");
    let mut resolvers = String::from("resolvers:\n");
    let mut stores = String::from("stores:\n");
    for (lane, exec) in lanes.iter().enumerate() {
        let names: Vec<String> = (0..cell.drives).map(|d| drive_name(lane, d)).collect();
        for n in &names {
            drives += &format!(
                "  {n}: {{ emulated: {{ namespaces: [{{ capacity: {capacity}, block_size: {BLOCK} }}], \
                 backing: ram, timing: {TIMING} }} }}\n"
            );
        }
        let execution = match exec {
            Exec::Gpu => "gpu",
            Exec::Cpu => "cpu",
        };
        let (q, qd) = (cell.queues, cell.queue_depth);
        datapaths += &if cell.drives == 1 {
            format!(
                "  dp{lane}: {{ local_nvme: {{ drive: {}, queues: {q}, queue_depth: {qd}, execution: {execution} }} }}\n",
                names[0]
            )
        } else {
            format!(
                "  dp{lane}: {{ striped_local_nvme: {{ drives: [{}], stripe_unit: {}, queues_per_drive: {q}, \
                 queue_depth: {qd}, execution: {execution} }} }}\n",
                names.join(", "),
                cell.stripe_unit
            )
        };
        resolvers += &format!("  slab{lane}: {{ slab: {{ slot_size: {} }} }}\n", cell.object);
        stores += &format!("  {}: {{ resolver: slab{lane}, datapath: dp{lane} }}\n", store_name(lane));
    }
    format!("{drives}{resolvers}{datapaths}{stores}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::cells;

    #[test]
    fn every_cell_config_is_accepted_and_holds_its_keys() {
        for cell in cells::full().iter().chain(&cells::short()) {
            let lanes = if cell.pair { vec![Exec::Cpu, Exec::Cpu] } else { vec![Exec::Cpu] };
            let keys = 4096;
            let y = yaml(cell, &lanes, keys);
            let cfg =
                tutti::Config::from_yaml_str(&y).unwrap_or_else(|e| panic!("{}: {e}\n{y}", cell.name()));
            assert_eq!(cfg.stores.len(), lanes.len());
            let per = drive_capacity(cell, keys);
            let store = per * cell.drives as u64;
            assert!(store / cell.object >= keys + 2, "{}", cell.name());
        }
    }
}
