//! `[ui]`: the components agents may show, each schema compiled now so a bad one is a
//! startup error.

use crate::config::{ConfigError, UiConfig, parse_size};

use super::file::FileUi;

/// The `[ui]` table as a [`UiConfig`]: the default components unless it names its own.
pub(super) fn resolve_ui(file: &FileUi) -> Result<UiConfig, ConfigError> {
    let mut ui = UiConfig::default();
    if let Some(text) = &file.max_props {
        ui.max_props =
            parse_size(text).map_err(|e| ConfigError::new(format!("ui.max_props: {e}")))?;
    }
    if let Some(components) = &file.components {
        let defaults = crate::runtime::ui::default_components();
        let mut chosen = Vec::new();
        for (i, component) in components.iter().enumerate() {
            let schema = match &component.schema_file {
                Some(path) => {
                    let text = std::fs::read_to_string(path).map_err(|e| {
                        ConfigError::new(format!("ui.components[{i}]: cannot read {}: {e}", path.display()))
                    })?;
                    serde_json::from_str(&text).map_err(|e| {
                        ConfigError::new(format!("ui.components[{i}]: {} is not JSON: {e}", path.display()))
                    })?
                }
                None => defaults
                    .iter()
                    .find(|(name, _)| *name == component.name)
                    .map(|(_, schema)| schema.clone())
                    .ok_or_else(|| {
                        ConfigError::new(format!(
                            "ui.components[{i}]: {:?} is not a default component; give its schema_file",
                            component.name
                        ))
                    })?,
            };
            chosen.push((component.name.clone(), schema));
        }
        ui.components = chosen;
    }
    // Every schema compiles now, so a bad one is a startup error.
    crate::runtime::ui::UiCatalog::new(ui.components.clone(), ui.max_props)
        .map_err(ConfigError::new)?;
    Ok(ui)
}
