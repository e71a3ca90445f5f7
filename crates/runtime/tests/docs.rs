//! The configuration shown in docs/config.md parses, validates and starts.

use tutti::{Config, Runtime};

fn yaml_block(md: &str) -> &str {
    let start = md.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let len = md[start..].find("```").expect("closed block");
    &md[start..start + len]
}

#[test]
fn docs_config_example_is_valid_and_starts() {
    let md = include_str!("../../../docs/config.md");
    let cfg = Config::from_yaml_str(yaml_block(md)).unwrap_or_else(|e| panic!("docs/config.md: {e}"));
    let rt = Runtime::from_config(cfg).expect("the documented topology starts");
    let info = rt.store_info("kv").unwrap();
    assert_eq!(info.drives, ["d0", "d1"]);
    assert_eq!(info.slot_size, Some(1 << 20));
    assert_eq!(info.capacity, 2 << 30);
}
