//! Enums users write by name (`--schedule zb-h1`, `dtype: bf16`): one macro gives each the
//! names it reads and prints, serde under the same names, `FromStr` with a message listing the
//! choices, and a one-line help per value for the command line — so the library never needs
//! clap, and every enum prints as users write it.

/// A closed set of values with user-facing names.
pub trait Named: Sized + Copy + 'static {
    /// Every value, in the order help lists them.
    const ALL: &'static [Self];
    /// The name users write.
    fn name(self) -> &'static str;
    /// One line of help (the variant's doc comment).
    fn help(self) -> &'static str;
}

/// Declares a `Named` enum: `Variant => "name"` per value, doc comments as help.
#[macro_export]
macro_rules! named_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident {
        $($(#[doc = $doc:literal])* $variant:ident => $text:literal),+ $(,)?
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
                 serde::Serialize, serde::Deserialize)]
        $vis enum $name {
            $($(#[doc = $doc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every value, in the order help lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name users write.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl $crate::named::Named for $name {
            const ALL: &'static [$name] = $name::ALL;
            fn name(self) -> &'static str {
                $name::name(self)
            }
            fn help(self) -> &'static str {
                match self { $($name::$variant => concat!("" $(, $doc)*).trim_ascii()),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                $name::ALL
                    .iter()
                    .copied()
                    .find(|v| v.name() == s)
                    .ok_or_else(|| $crate::named::unknown::<$name>(stringify!($name), s))
            }
        }
    };
}

/// The message for a name that is none of `T`'s.
pub fn unknown<T: Named>(what: &str, given: &str) -> String {
    let all: Vec<&str> = T::ALL.iter().map(|v| v.name()).collect();
    format!(
        "unknown {} '{given}': use one of {}",
        what.to_lowercase(),
        all.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::Named;

    crate::named_enum!(
        /// A test enum.
        enum Colour {
            /// The colour of the sky.
            Blue => "blue",
            Dark => "dark-red",
        }
    );

    #[test]
    fn names_help_and_parsing() {
        assert_eq!("dark-red".parse::<Colour>().unwrap(), Colour::Dark);
        assert_eq!(Colour::Blue.to_string(), "blue");
        assert_eq!(Named::help(Colour::Blue), "The colour of the sky.");
        assert_eq!(Named::help(Colour::Dark), "");
        let e = "red".parse::<Colour>().unwrap_err();
        assert_eq!(e, "unknown colour 'red': use one of blue, dark-red");
        assert_eq!(
            serde_json::to_string(&Colour::Dark).unwrap(),
            "\"dark-red\""
        );
    }
}
